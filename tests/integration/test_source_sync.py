"""Sources kept in sync against a real PostgreSQL, with a reader faked in memory: what a run
writes (and does not), prunes, keeps; its states after a crash; one run of a source at a time;
runs as worker jobs, taken over when a worker dies; the schedule; the CLI's in-process run."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import func, select, text

import ingest.sources.runs as runs
import ingest.sources.sync as sync
from ingest.sources.base import (
    Changed,
    Failed,
    ItemState,
    ScanEvent,
    SourceError,
    SourceReader,
    Unchanged,
)
from ingest.sources.schedule import queue_due_runs
from ingest.sources.sync import SyncReport, sync_source
from ingest.worker import JobWorker
from ragservice import store
from ragservice.db.locks import SessionLock
from ragservice.db.models import Chunk, Document, IngestJob, Source, SourceItem
from ragservice.errors import ConflictError
from ragservice.runtime import Runtime
from ragservice.services import sources as service
from ragservice.services.callers import Operator
from tests.integration.test_jobs import claim_held, end_claim_sessions

COLLECTION = "site"
SITE = "https://docs.example.org"


def page(n: int, version: int = 1) -> str:
    return f"Page {n} revision {version}: notes on topic {n} for the synchronised site."


class FakeSite:
    """A source in memory: `pages` key → text; an ETag per text. `failing` keys answer an
    error; `complete` False stops like a crawl at its page limit; `explode_after` raises
    (SourceError or another exception) after that many documents."""

    def __init__(self, pages: Mapping[str, str]) -> None:
        self.pages = dict(pages)
        self.failing: set[str] = set()
        self.complete = True
        self.explode_after: int | None = None
        self.explosion: Exception = SourceError("the site went away")
        self.fetched: list[str] = []

    def scan(self, known: Mapping[str, ItemState]) -> Iterator[ScanEvent]:
        self.fetched = []
        for count, (key, body) in enumerate(sorted(self.pages.items())):
            if self.explode_after is not None and count >= self.explode_after:
                raise self.explosion
            if key in self.failing:
                yield Failed(key, "HTTP 500")
                continue
            digest = hashlib.sha256(body.encode()).hexdigest()
            state = ItemState(etag=digest[:16], content_hash=digest)
            prior = known.get(key)
            if prior is not None and prior.etag == state.etag:
                yield Unchanged(key, state)
                continue
            self.fetched.append(key)
            name = key.rsplit("/", 1)[-1] + ".txt"
            yield Changed(key, name, body.encode(), state, origin={"url": key})


def site(n: int) -> FakeSite:
    return FakeSite({f"{SITE}/p{i:03d}": page(i) for i in range(n)})


def add_source(
    runtime: Runtime, *, readers: tuple[str, ...] | None = None, every: int | None = None
) -> Source:
    with runtime.db.write() as session:
        cid = store.collections.ensure_collection(session, runtime.default_tenant_id, COLLECTION)
        return store.sources.add_source(
            session,
            store.sources.NewSource(
                tenant_id=runtime.default_tenant_id,
                collection_id=cid,
                kind="web",
                location=SITE,
                options={},
                readers=readers,
                every_seconds=every,
                prune=True,
            ),
        )


def run(runtime: Runtime, source: Source, reader: SourceReader) -> SyncReport:
    return sync_source(runtime, runs.source_target(runtime, source), reader)


def documents(runtime: Runtime) -> dict[str, tuple[uuid.UUID, int, datetime]]:
    """external id → (id, version, updated_at) of the collection's documents."""
    with runtime.db.read() as session:
        rows = session.execute(
            select(Document.external_id, Document.id, Document.version, Document.updated_at)
        )
        return {row[0]: (row[1], row[2], row[3]) for row in rows}


def chunk_count(runtime: Runtime) -> int:
    with runtime.db.read() as session:
        return int(session.scalar(select(func.count()).select_from(Chunk)) or 0)


def item_keys(runtime: Runtime, source: Source) -> set[str]:
    with runtime.db.read() as session:
        return set(session.scalars(select(SourceItem.key).where(SourceItem.source_id == source.id)))


def counts(report: SyncReport) -> dict[str, int]:
    return {k: v for k, v in report.counts().items() if v}


@pytest.fixture
def fake_readers(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeSite]:
    """Readers the runs of jobs and of the CLI open, by location."""
    readers: dict[str, FakeSite] = {}

    def open_reader(
        _settings: Any, location: str, _options: dict[str, Any], **_given: Any
    ) -> SourceReader:
        return readers[location]

    monkeypatch.setattr(runs, "open_reader", open_reader)
    return readers


def test_first_run_adds_every_document_and_a_rerun_writes_nothing(runtime: Runtime) -> None:
    source = add_source(runtime)
    reader = site(20)

    first = run(runtime, source, reader)
    assert counts(first) == {"found": 20, "added": 20}
    assert first.complete and first.errors == []
    before, chunks = documents(runtime), chunk_count(runtime)
    assert len(before) == 20 and chunks >= 20
    assert item_keys(runtime, source) == set(reader.pages)

    again = run(runtime, source, reader)
    assert counts(again) == {"found": 20, "unchanged": 20, "not_modified": 20}
    assert reader.fetched == []
    assert documents(runtime) == before  # same rows, versions, updated_at
    assert chunk_count(runtime) == chunks


def test_changes_removals_and_failures_are_exactly_what_the_store_gets(runtime: Runtime) -> None:
    source = add_source(runtime)
    reader = site(12)
    run(runtime, source, reader)
    before = documents(runtime)
    keys = sorted(reader.pages)
    changed, removed, failing = keys[:2], keys[2:5], keys[5]
    for key in changed:
        reader.pages[key] = reader.pages[key] + " Revised."
    for key in removed:
        del reader.pages[key]
    reader.failing.add(failing)
    reader.pages[f"{SITE}/new"] = "A new page about something else entirely."

    report = run(runtime, source, reader)

    assert counts(report) == {
        "found": 10,
        "added": 1,
        "changed": 2,
        "unchanged": 6,
        "not_modified": 6,
        "removed": 3,
        "failed": 1,
    }
    assert report.errors == [(failing, "HTTP 500")]
    after = documents(runtime)
    assert set(after) == (set(before) - set(removed)) | {f"{SITE}/new"}
    assert failing in after  # kept as stored
    for key in changed:
        assert after[key][1] == before[key][1] + 1
    for key in set(keys) - set(changed) - set(removed):
        assert after[key] == before[key]
    assert item_keys(runtime, source) == set(reader.pages)


def test_an_incomplete_or_failed_scan_deletes_nothing(runtime: Runtime) -> None:
    source = add_source(runtime)
    reader = site(8)
    run(runtime, source, reader)
    for key in sorted(reader.pages)[:4]:
        del reader.pages[key]

    reader.complete = False  # stopped at its page limit
    partial = run(runtime, source, reader)
    assert (partial.complete, partial.removed) == (False, 0)
    assert len(documents(runtime)) == 8

    reader.complete = True
    reader.explode_after = 2
    failed = run(runtime, source, reader)
    assert failed.failure == "the site went away"
    assert (failed.complete, failed.removed, failed.found) == (False, 0, 2)
    assert len(documents(runtime)) == 8

    reader.explode_after = None
    assert run(runtime, source, reader).removed == 4
    assert len(documents(runtime)) == 4


def test_a_removed_documents_cached_answers_go_with_it(runtime: Runtime) -> None:
    source = add_source(runtime)
    reader = site(3)
    run(runtime, source, reader)
    gone = sorted(reader.pages)[0]
    doc_id, version, _ = documents(runtime)[gone]
    model = runtime.models.current()
    with runtime.db.write() as session:
        cid = store.collections.require_collection_id(
            session, runtime.default_tenant_id, COLLECTION
        )
        entry = store.prompt_cache.cache_store(
            session,
            store.prompt_cache.NewCacheEntry(
                tenant_id=runtime.default_tenant_id,
                scope="test",
                model_id=model.id,
                collection_ids=[cid],
                prompt_hash="h",
                prompt="what is on page 0?",
                embedding=np.ones(model.dimension, dtype=np.float32),
                answer="notes",
                response={},
                ttl_seconds=3600,
                sources={doc_id: version},
            ),
        )
    assert entry is not None
    del reader.pages[gone]

    assert run(runtime, source, reader).removed == 1

    with runtime.db.read() as session:
        left = session.execute(text("SELECT count(*) FROM prompt_cache")).scalar_one()
    assert left == 0


def test_the_sources_readers_are_given_to_its_documents(runtime: Runtime) -> None:
    source = add_source(runtime, readers=("group:hr",))
    report = run(runtime, source, site(3))
    assert report.restricted
    with runtime.db.read() as session:
        readers = set(session.scalars(select(func.array_to_string(Document.readers, ","))))
    assert readers == {"group:hr"}


def test_a_run_that_dies_halfway_saves_states_only_for_what_it_wrote(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sync, "BATCH_DOCUMENTS", 4)
    source = add_source(runtime)
    reader = site(10)
    reader.explode_after = 6
    reader.explosion = RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        run(runtime, source, reader)
    written = set(documents(runtime))
    assert len(written) == 4  # one whole batch committed; the next never reached the store
    assert item_keys(runtime, source) == written

    reader.explode_after = None
    rerun = run(runtime, source, reader)
    assert counts(rerun) == {"found": 10, "added": 6, "unchanged": 4, "not_modified": 4}
    assert len(documents(runtime)) == 10


def source_job(runtime: Runtime, job_id: uuid.UUID) -> IngestJob:
    with runtime.db.read() as session:
        found = store.jobs.get_job(session, None, job_id)
    assert found is not None
    return found


def queue(runtime: Runtime, source: Source) -> uuid.UUID:
    return service.queue_run(runtime.db, runtime.default_tenant_id, COLLECTION, source.id)


def test_a_worker_runs_a_source_job_and_records_the_syncs_counts(
    runtime: Runtime, fake_readers: dict[str, FakeSite]
) -> None:
    source = add_source(runtime)
    fake_readers[SITE] = site(5)
    fake_readers[SITE].failing.add(f"{SITE}/p004")
    job_id = queue(runtime, source)

    assert JobWorker(runtime, threads=0).run_once()

    job = source_job(runtime, job_id)
    assert (job.status, job.kind, job.source_id) == ("done", "source", source.id)
    assert job.counts["added"] == 4 and job.counts["failed"] == 1
    assert job.errors == [{"source": f"{SITE}/p004", "error": "HTTP 500"}]
    view = service.get_source(runtime.db, runtime.default_tenant_id, COLLECTION, source.id)
    assert view.last_run is not None and view.last_run.job_id == job_id
    assert view.last_run.counts["added"] == 4


def test_a_source_that_cannot_be_read_fails_its_job(
    runtime: Runtime, fake_readers: dict[str, FakeSite]
) -> None:
    source = add_source(runtime)
    fake_readers[SITE] = site(3)
    fake_readers[SITE].explode_after = 0
    job_id = queue(runtime, source)
    assert JobWorker(runtime, threads=0).run_once()
    job = source_job(runtime, job_id)
    assert job.status == "failed"
    assert job.errors == [{"error": "the site went away"}]
    with pytest.raises(ConflictError, match="run of a source"), runtime.db.write() as session:
        store.jobs.retry_job(session, None, job_id)  # the source is run again instead


def test_one_run_of_a_source_at_a_time(runtime: Runtime, fake_readers: dict[str, FakeSite]) -> None:
    source = add_source(runtime)
    fake_readers[SITE] = site(2)
    job_id = queue(runtime, source)
    with pytest.raises(ConflictError, match=str(job_id)):
        queue(runtime, source)

    first, second = SessionLock(runtime.db.url), SessionLock(runtime.db.url)
    try:
        claimed = claim_held(runtime, "one", first)
        assert claimed is not None and claimed.id == job_id
        assert claim_held(runtime, "two", second) is None  # nothing else to run
        with pytest.raises(ConflictError):
            queue(runtime, source)  # still running
        with pytest.raises(ConflictError):
            service.run_now(runtime, runtime.default_tenant_id, COLLECTION, source.id)
    finally:
        first.release()
        second.release()


def test_a_run_whose_worker_died_is_taken_over_and_finished(
    runtime: Runtime, database_url: str, fake_readers: dict[str, FakeSite]
) -> None:
    source = add_source(runtime)
    fake_readers[SITE] = site(6)
    job_id = queue(runtime, source)
    dying = SessionLock(runtime.db.url)
    try:
        assert claim_held(runtime, "dying", dying) is not None
        assert end_claim_sessions(database_url) == 1  # the worker's process is gone
    finally:
        dying.release()

    assert JobWorker(runtime, threads=0).run_once()

    job = source_job(runtime, job_id)
    assert (job.status, job.attempts) == ("done", 2)
    assert job.counts["added"] == 6


def test_the_schedule_queues_due_sources_once(runtime: Runtime) -> None:
    due = add_source(runtime, every=3600)
    with runtime.db.write() as session:
        session.execute(
            text("UPDATE sources SET next_run_at = now() - interval '1 second' WHERE id = :id"),
            {"id": due.id},
        )

    queued = queue_due_runs(runtime.db)
    assert len(queued) == 1
    assert queue_due_runs(runtime.db) == []  # its next run is an hour on
    job = source_job(runtime, queued[0])
    assert (job.kind, job.status, job.source_id) == ("source", "queued", due.id)
    with runtime.db.read() as session:
        next_run = session.scalar(select(Source.next_run_at).where(Source.id == due.id))
        now = session.scalar(select(func.now()))
    assert next_run is not None and now is not None
    assert 3500 < (next_run - now).total_seconds() <= 3600


def test_the_cli_runs_a_source_in_process_as_a_recorded_job(
    runtime: Runtime, fake_readers: dict[str, FakeSite]
) -> None:
    source = add_source(runtime)
    fake_readers[SITE] = site(4)
    seen: list[int] = []

    report = service.run_now(
        runtime,
        runtime.default_tenant_id,
        COLLECTION,
        source.id,
        progress=lambda r: seen.append(r.found),
    )

    assert counts(report) == {"found": 4, "added": 4}
    assert seen and seen[-1] == 4
    view = service.get_source(runtime.db, runtime.default_tenant_id, COLLECTION, source.id)
    assert view.last_run is not None
    assert (view.last_run.status, view.last_run.counts["added"]) == ("done", 4)
    assert source_job(runtime, view.last_run.job_id).kind == "cli"


def test_a_killed_cli_run_does_not_block_its_source(
    runtime: Runtime, fake_readers: dict[str, FakeSite]
) -> None:
    source = add_source(runtime)
    fake_readers[SITE] = site(1)
    with SessionLock(runtime.db.url) as dead, runtime.db.write() as session:
        stuck = store.sources.start_cli_run(session, source, worker="cli:gone", claim_key=dead.key)
    assert stuck is not None  # its lock was released with its "process"

    job_id = queue(runtime, source)

    assert source_job(runtime, stuck).status == "failed"
    assert source_job(runtime, job_id).status == "queued"


def test_removing_a_source_with_its_documents(runtime: Runtime) -> None:
    source = add_source(runtime)
    run(runtime, source, site(3))
    assert len(documents(runtime)) == 3
    caller = Operator(tenant_id=runtime.default_tenant_id, actor="cli:test")
    service.remove_source(runtime.db, caller, COLLECTION, source.id, delete_documents=True)
    assert documents(runtime) == {}
    assert service.list_sources(runtime.db, runtime.default_tenant_id, COLLECTION) == []
    with runtime.db.read() as session:
        assert session.scalar(select(func.count()).select_from(SourceItem)) == 0


def test_migration_0027_downgrades_with_sources_and_runs_and_comes_back(
    runtime: Runtime, settings: Any
) -> None:
    from alembic import command
    from sqlalchemy import create_engine

    from ragservice.db import migrate

    source = add_source(runtime)
    queue(runtime, source)
    runtime.db.dispose()
    engine = create_engine(settings.database.owner_url.get_secret_value())
    config = migrate.alembic_config()
    try:
        with engine.connect() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0026")
            conn.commit()
            tables = set(
                conn.execute(
                    text("SELECT tablename FROM pg_tables WHERE tablename LIKE 'source%'")
                ).scalars()
            )
            jobs = conn.execute(text("SELECT count(*) FROM ingest_jobs")).scalar()
            command.upgrade(config, "head")
            conn.commit()
    finally:
        engine.dispose()
    assert (tables, jobs) == (set(), 1)


def test_running_job_threads_queue_and_run_the_due_sources(
    runtime: Runtime, fake_readers: dict[str, FakeSite]
) -> None:
    scheduling = dataclasses.replace(
        runtime, settings=runtime.settings.model_copy(update={"sources_poll_seconds": 0.1})
    )
    source = add_source(scheduling, every=60)
    fake_readers[SITE] = site(2)
    with scheduling.db.write() as session:
        session.execute(
            text("UPDATE sources SET next_run_at = now() WHERE id = :id"), {"id": source.id}
        )
    worker = JobWorker(scheduling, threads=1)
    worker.start()
    try:
        deadline = time.monotonic() + 60
        while (run := last_run(scheduling, source)) is None or run.status != "done":
            assert time.monotonic() < deadline, "the scheduled run did not end"
            time.sleep(0.05)
    finally:
        worker.stop()
    assert run.counts["added"] == 2


def last_run(runtime: Runtime, source: Source) -> service.SourceRun | None:
    return service.get_source(runtime.db, runtime.default_tenant_id, COLLECTION, source.id).last_run


class Mailbox:
    """A source of e-mail files in memory: key → the message's bytes."""

    def __init__(self, messages: Mapping[str, bytes]) -> None:
        self.messages = dict(messages)

    def scan(self, known: Mapping[str, ItemState]) -> Iterator[ScanEvent]:
        for key, data in sorted(self.messages.items()):
            digest = hashlib.sha256(data).hexdigest()
            state = ItemState(etag=digest[:16], content_hash=digest)
            prior = known.get(key)
            if prior is not None and prior.etag == state.etag:
                yield Unchanged(key, state)
            else:
                yield Changed(key, key.rsplit("/", 1)[-1], data, state, origin={"url": key})


def test_an_e_mails_attachments_go_when_they_leave_it_and_with_it(runtime: Runtime) -> None:
    from tests.corpus_mail import make_email

    source = add_source(runtime)
    mail, note = f"{SITE}/mail.eml", f"{SITE}/note.eml"
    box = Mailbox({mail: make_email(), note: make_email("A note", attach=False)})
    run(runtime, source, box)
    attachments = {f"{mail}/invoice.pdf", f"{mail}/packing list.txt"}
    assert set(documents(runtime)) == {mail, note, *attachments}

    box.messages[mail] = make_email(body="No attachments this time.", attach=False)
    assert counts(run(runtime, source, box))["changed"] == 1
    assert set(documents(runtime)) == {mail, note}  # the attachments left with the change

    box.messages[mail] = make_email()
    run(runtime, source, box)
    del box.messages[mail]
    assert counts(run(runtime, source, box))["removed"] == 1
    assert set(documents(runtime)) == {note}  # the message and its attachments


def test_files_no_loader_reads_are_skipped_and_listed_not_failed(
    runtime: Runtime, tmp_path: Path
) -> None:
    """A folder's spreadsheet of another format, and the GIF a real message carries: skipped
    (counted and listed), not failed; the message and the other files are written."""
    from ingest.sources.folder import FolderReader

    mail = Path(__file__).parents[1] / "realdocs" / "mail" / "cpython-msg07-dingus-fish.eml"
    shutil.copy(mail, tmp_path / "fish.eml")
    (tmp_path / "budget.ods").write_bytes(b"PK\x03\x04 a spreadsheet")
    (tmp_path / "notes.txt").write_text("Pumps move water.")
    source = add_source(runtime)
    first = run(runtime, source, FolderReader(tmp_path))
    assert counts(first) == {"found": 2, "added": 2, "skipped": 2}
    assert first.skips == [
        ("budget.ods", "unsupported file type .ods"),
        ("fish.eml/dingusfish.gif", "unsupported file type .gif"),
    ]
    assert first.errors == [] and first.complete
    assert set(documents(runtime)) == {"fish.eml", "notes.txt"}
    again = run(runtime, source, FolderReader(tmp_path))  # the message is not read again
    assert counts(again) == {"found": 2, "unchanged": 2, "not_modified": 2, "skipped": 1}
