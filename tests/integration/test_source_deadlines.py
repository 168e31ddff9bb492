"""A source whose site trickles (a byte every two seconds: no read ever times out) run by a
job worker with one thread: the run ends by its deadline, failed with a clear error, and
another tenant's upload queued behind it is done meanwhile."""

from __future__ import annotations

import dataclasses
import time
import uuid

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


def ended(runtime: Runtime, job_id: uuid.UUID) -> IngestJob | None:
    with runtime.db.read() as session:
        job = store.jobs.get_job(session, None, job_id)
    assert job is not None
    return job if job.status in ("done", "failed") else None


def test_a_trickling_site_ends_by_the_run_deadline_and_another_tenants_upload_runs(
    runtime: Runtime,
) -> None:
    local = dataclasses.replace(
        runtime,
        settings=runtime.settings.model_copy(
            update={"sources_allow_private": True, "job_poll_seconds": 0.2}
        ),
    )
    with slow_site({}) as (site, base):
        spec = SourceSpec(location=f"{base}/slow-start.html", options={"run_seconds": RUN_SECONDS})
        caller = Operator(tenant_id=local.default_tenant_id, actor="cli:test")
        source = service.add_source(local.db, local.settings, caller, "site", spec)
        run = service.queue_run(local.db, local.default_tenant_id, "site", source.id)
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
