"""Source runs beside another tenant's upload, on a loopback site: a trickling page (a byte
every two seconds: no read ever times out) ends by the run's or the answer's deadline, and a
long crawl takes turns with the upload on one job thread."""

from __future__ import annotations

import dataclasses
import time
import uuid

from sqlalchemy import select

from ingest.worker import JobWorker
from ragservice import store
from ragservice.db.models import IngestJob
from ragservice.runtime import Runtime
from ragservice.services import sources as service
from ragservice.services.callers import Operator
from ragservice.services.sources import SourceSpec
from tests.integration.test_job_fairness import enqueue_for, tenant
from tests.integration.test_jobs import wait_for
from tests.slow_site import slow_site

RUN_SECONDS = 4.0


def with_sources(runtime: Runtime, **settings: object) -> Runtime:
    """`runtime` allowed to crawl loopback, its idle workers polling often, and `settings`."""
    update = {"sources_allow_private": True, "job_poll_seconds": 0.2, **settings}
    return dataclasses.replace(runtime, settings=runtime.settings.model_copy(update=update))


def queue_source_run(runtime: Runtime, spec: SourceSpec) -> tuple[uuid.UUID, uuid.UUID]:
    """A source of `spec` added to the default tenant's collection `site`, and its run queued:
    the source's and the run's ids."""
    caller = Operator(tenant_id=runtime.default_tenant_id, actor="cli:test")
    source = service.add_source(runtime.db, runtime.settings, caller, "site", spec)
    return source.id, service.queue_run(runtime.db, runtime.default_tenant_id, "site", source.id)


def ended(runtime: Runtime, job_id: uuid.UUID) -> IngestJob | None:
    with runtime.db.read() as session:
        job = store.jobs.get_job(session, None, job_id)
    assert job is not None
    return job if job.status in ("done", "failed") else None


def test_a_trickling_site_ends_by_the_run_deadline_and_another_tenants_upload_runs(
    runtime: Runtime,
) -> None:
    local = with_sources(runtime)
    with slow_site({}) as (site, base):
        spec = SourceSpec(location=f"{base}/slow-start.html", options={"run_seconds": RUN_SECONDS})
        _source, run = queue_source_run(local, spec)
        upload = enqueue_for(local, tenant(local, "other"))  # queued behind the run

        worker = JobWorker(local, threads=1)
        began = time.monotonic()
        worker.start()
        try:
            wait_for(lambda: ended(local, run) is not None, timeout=RUN_SECONDS + 60)
            run_ended = time.monotonic() - began
            wait_for(lambda: ended(local, upload) is not None, timeout=120)
            upload_ended = time.monotonic() - began
        finally:
            worker.stop()
        assert "/slow-start.html" in site.asked

    finished = ended(local, run)
    assert finished is not None and finished.started_at and finished.finished_at
    assert finished.status == "failed"
    assert finished.errors == [
        {
            "error": f"the run stopped at its deadline of {RUN_SECONDS:g} s "
            "(RAGSERVICE_SOURCE_RUN_SECONDS, or the source's run_seconds); what it wrote is "
            "kept, nothing was deleted, and the next run goes on from there"
        }
    ]
    ran = (finished.finished_at - finished.started_at).total_seconds()
    assert ran < RUN_SECONDS + 3.0, ran  # its deadline, and the time to open and record it
    done = ended(local, upload)
    assert done is not None and done.status == "done", done and done.errors
    print(
        f"run ended after {ran:.1f} s (deadline {RUN_SECONDS:g} s; {run_ended:.1f} s after the "
        f"worker started); the other tenant's upload was done {upload_ended:.1f} s after"
    )


PAGES = 30


def runs_of(runtime: Runtime, source_id: uuid.UUID) -> list[IngestJob]:
    with runtime.db.read() as session:
        found = session.scalars(
            select(IngestJob).where(IngestJob.source_id == source_id).order_by(IngestJob.created_at)
        )
        return list(found)


def test_a_long_run_takes_turns_with_another_tenants_upload(runtime: Runtime) -> None:
    """One job thread, a crawl of 31 pages of 0.2 s each (over 6 s) and a turn of 1 s: once
    another tenant's upload waits, the run stops between two pages, done for now, the upload
    runs, and the source's next run (queued behind it) finishes the crawl."""
    local = with_sources(runtime, crawl_rate=1000.0, source_turn_seconds=1.0)
    links = "".join(f'<a href="/pause-{i}.html">page {i}</a> ' for i in range(PAGES))
    pages = {f"/pause-{i}.html": f"<p>Pause page {i}.</p>".encode() for i in range(PAGES)}
    pages["/index.html"] = f"<html><body><p>Index.</p>{links}</body></html>".encode()
    with slow_site(pages) as (site, base):
        spec = SourceSpec(location=f"{base}/index.html", options={"depth": 1})
        source_id, first = queue_source_run(local, spec)
        worker = JobWorker(local, threads=1)
        worker.start()
        try:
            wait_for(lambda: len(site.asked) >= 3, timeout=60)  # the crawl is under way
            upload = enqueue_for(local, tenant(local, "other"))
            wait_for(lambda: ended(local, upload) is not None, timeout=120)
            crawled_then = len({path for path in site.asked if path.startswith("/pause")})
            wait_for(
                lambda: (
                    all(ended(local, r.id) for r in runs_of(local, source_id))
                    and len(runs_of(local, source_id)) >= 2
                ),
                timeout=120,
            )
        finally:
            worker.stop()

    assert crawled_then < PAGES  # the upload did not wait for the whole crawl
    done = ended(local, upload)
    assert done is not None and done.status == "done", done and done.errors
    runs = runs_of(local, source_id)
    assert runs[0].id == first and runs[0].status == "done" and runs[0].counts["yielded"] == 1
    assert runs[-1].status == "done" and runs[-1].counts["yielded"] == 0
    assert sum(r.counts["added"] for r in runs) == PAGES + 1  # every page, once
    assert runs[1].created_at > done.created_at  # the next run queued behind the upload


def test_with_two_threads_another_tenants_upload_runs_while_a_trickling_run_goes_on(
    runtime: Runtime,
) -> None:
    """The same trickling site with two job threads: the run holds one until its deadline
    (here, the per-answer one: 6 s); the other tenant's upload, queued after it, is done on the
    other thread before the run ends."""
    local = with_sources(runtime)
    with slow_site({}) as (_site, base):
        spec = SourceSpec(location=f"{base}/slow-start.html", options={"response_seconds": 6})
        _source, run = queue_source_run(local, spec)
        worker = JobWorker(local, threads=2)
        worker.start()
        try:
            upload = enqueue_for(local, tenant(local, "other"))
            wait_for(lambda: ended(local, upload) is not None, timeout=120)
            wait_for(lambda: ended(local, run) is not None, timeout=120)
        finally:
            worker.stop()
    finished, done = ended(local, run), ended(local, upload)
    assert finished is not None and done is not None and done.status == "done"
    assert finished.finished_at and done.finished_at and done.finished_at < finished.finished_at
    assert finished.started_at and finished.finished_at
    ran = (finished.finished_at - finished.started_at).total_seconds()
    assert 6.0 <= ran < 6.0 + 5.0, ran
