"""Queued ingest jobs against a real PostgreSQL: enqueue, claim, heartbeat, retry, workers."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from ingest.worker import JobWorker, run_until_signalled
from ragservice import store
from ragservice.db import tenancy
from ragservice.db.locks import SessionLock
from ragservice.db.models import IngestJob
from ragservice.dev.cluster import libpq_url
from ragservice.runtime import Runtime

COLLECTION = "uploads"


def with_settings(runtime: Runtime, **changes: Any) -> Runtime:
    return dataclasses.replace(runtime, settings=runtime.settings.model_copy(update=changes))


def text_item(
    name: str, body: str, title: str | None = None, **metadata: Any
) -> store.jobs.JobItem:
    return store.jobs.JobItem(
        kind="text", name=name, title=title, body=body.encode(), metadata=dict(metadata)
    )


def file_item(name: str, body: bytes, **metadata: Any) -> store.jobs.JobItem:
    return store.jobs.JobItem(
        kind="file", name=name, title=None, body=body, metadata=dict(metadata)
    )


def enqueue(
    runtime: Runtime, items: list[store.jobs.JobItem], collection: str = COLLECTION, **params: Any
) -> uuid.UUID:
    with runtime.db.write() as session:
        tenant_id = runtime.default_tenant_id
        collection_id = store.collections.ensure_collection(session, tenant_id, collection)
        return store.jobs.enqueue_job(
            session,
            tenant_id=tenant_id,
            collection_id=collection_id,
            kind="upload",
            params={**params, "items": len(items)},
            items=items,
        )


def claim(runtime: Runtime, worker: str, max_attempts: int = 3) -> store.jobs.ClaimedJob | None:
    with runtime.db.write() as session:
        return store.jobs.claim_job(
            session, worker=worker, stale_after_seconds=60, max_attempts=max_attempts
        )


def job(runtime: Runtime, job_id: uuid.UUID) -> IngestJob:
    with runtime.db.read() as session:
        found = store.jobs.get_job(session, runtime.default_tenant_id, job_id)
    assert found is not None
    return found


def scalar(runtime: Runtime, query: str, **params: object) -> Any:
    with runtime.db.read() as session:
        return session.execute(text(query), params).scalar()


def execute(runtime: Runtime, query: str, **params: object) -> None:
    with runtime.db.write() as session:
        session.execute(text(query), params)


def age_heartbeat(runtime: Runtime, job_id: uuid.UUID) -> None:
    execute(
        runtime,
        "UPDATE ingest_jobs SET heartbeat_at = now() - interval '1 hour' WHERE id = :id",
        id=job_id,
    )


def wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


UPLOAD = [
    text_item("t1", "Aspirin reduces the risk of heart attacks in adults.", "Aspirin", lang="en"),
    file_item("notes.txt", b"Vitamin D deficiency is linked to bone fractures.", team="bio"),
    file_item("guide.md", b"# Folding\n\nProteins fold into shapes inside cells.", team="bio"),
    file_item("broken.pdf", b"%PDF-1.4 this is not really a PDF", team="bio"),
]


def test_upload_job_ingests_texts_and_files(runtime: Runtime) -> None:
    job_id = enqueue(runtime, UPLOAD)
    worker = JobWorker(runtime)

    assert worker.run_once()

    done = job(runtime, job_id)
    assert (done.status, done.attempts) == ("done", 1)
    assert (done.counts["new"], done.counts["failed"], done.counts["unchanged"]) == (3, 1, 0)
    assert [e["source"] for e in done.errors] == ["broken.pdf"]
    assert done.errors[0]["error"].startswith("not a valid PDF")
    assert done.finished_at is not None and done.started_at is not None
    with runtime.db.read() as session:
        rows = session.execute(
            text("SELECT external_id, title, metadata FROM documents ORDER BY external_id")
        ).all()
    assert [tuple(row) for row in rows] == [
        (
            "guide.md",
            "Folding",
            {"source_path": "guide.md", "file_type": "markdown", "team": "bio"},
        ),
        ("notes.txt", None, {"source_path": "notes.txt", "file_type": "text", "team": "bio"}),
        ("t1", "Aspirin", {"lang": "en"}),
    ]
    # Searchable by full text and by vector, like documents of the CLI.
    found = scalar(
        runtime,
        "SELECT d.external_id FROM chunks c JOIN documents d ON d.id = c.document_id "
        "WHERE to_tsvector('english', c.text) @@ plainto_tsquery('english', 'fractures')",
    )
    assert found == "notes.txt"
    query = runtime.embedder.embed(["Does aspirin prevent heart attacks?"])[0]
    nearest = scalar(
        runtime,
        "SELECT d.external_id FROM chunk_embeddings e JOIN chunks c ON c.id = e.chunk_id "
        "JOIN documents d ON d.id = c.document_id "
        "ORDER BY e.embedding <=> CAST(:q AS vector) LIMIT 1",
        q=str(query.tolist()),
    )
    assert nearest == "t1"
    # A finished job no longer needs its uploads; nothing else is waiting.
    assert scalar(runtime, "SELECT count(*) FROM ingest_job_items") == 0
    assert not worker.run_once()


def test_jsonl_upload_uses_the_jobs_field_mapping(runtime: Runtime) -> None:
    rows = b'{"doc": "r1", "body": "Row one text."}\n{"doc": "r2", "body": "Row two text."}\n'
    job_id = enqueue(runtime, [file_item("rows.jsonl", rows)], jsonl_fields="id=doc,text=body")
    assert JobWorker(runtime).run_once()
    assert job(runtime, job_id).counts["new"] == 2
    assert scalar(runtime, "SELECT string_agg(external_id, ',' ORDER BY 1) FROM documents") == (
        "r1,r2"
    )

    bad = enqueue(runtime, [file_item("rows.jsonl", rows)], jsonl_fields="oops")
    assert JobWorker(runtime).run_once()
    failed = job(runtime, bad)
    assert failed.status == "failed"
    assert failed.errors == [{"error": "invalid JSONL field spec 'oops': 'oops' is not key=value"}]


def test_concurrent_claims_never_get_the_same_job(runtime: Runtime) -> None:
    first = enqueue(runtime, UPLOAD[:1])
    second = enqueue(runtime, UPLOAD[1:2])

    # Three transactions open at once: the first's row lock makes the others skip its job.
    with runtime.db.write() as a:
        claimed_a = store.jobs.claim_job(a, worker="a", stale_after_seconds=60, max_attempts=3)
        with runtime.db.write() as b:
            claimed_b = store.jobs.claim_job(b, worker="b", stale_after_seconds=60, max_attempts=3)
            with runtime.db.write() as c:
                assert (
                    store.jobs.claim_job(c, worker="c", stale_after_seconds=60, max_attempts=3)
                    is None
                )

    assert claimed_a is not None and claimed_b is not None
    assert (claimed_a.id, claimed_b.id) == (first, second)  # oldest first
    assert (claimed_a.collection, claimed_a.attempts) == (COLLECTION, 1)
    assert [(job(runtime, i).status, job(runtime, i).worker) for i in (first, second)] == [
        ("running", "a"),
        ("running", "b"),
    ]


def test_job_with_a_stale_heartbeat_is_taken_over(runtime: Runtime) -> None:
    job_id = enqueue(runtime, UPLOAD[:1])
    assert claim(runtime, "dead") is not None
    assert claim(runtime, "alive") is None  # its heartbeat is fresh

    age_heartbeat(runtime, job_id)
    taken = claim(runtime, "alive")

    assert taken is not None
    assert (taken.id, taken.attempts, taken.worker) == (job_id, 2, "alive")
    with runtime.db.write() as session:
        assert not store.jobs.heartbeat_job(session, job_id, "dead")
        assert store.jobs.heartbeat_job(session, job_id, "alive", counts={"new": 1})
        # The first worker, should it come back, cannot overwrite the new attempt's end.
        assert not store.jobs.finish_job(
            session, job_id, status="done", counts={}, errors=[], worker="dead"
        )
    assert (job(runtime, job_id).status, job(runtime, job_id).counts) == ("running", {"new": 1})


def test_stale_job_past_max_attempts_fails(runtime: Runtime) -> None:
    job_id = enqueue(runtime, UPLOAD[:2])
    assert claim(runtime, "w1", max_attempts=2) is not None
    age_heartbeat(runtime, job_id)
    assert claim(runtime, "w2", max_attempts=2) is not None
    age_heartbeat(runtime, job_id)

    assert claim(runtime, "w3", max_attempts=2) is None

    failed = job(runtime, job_id)
    assert (failed.status, failed.attempts, failed.worker) == ("failed", 2, "w2")
    assert failed.errors == [
        {"error": "gave up after 2 attempts: worker w2 stopped sending heartbeats"}
    ]
    assert failed.finished_at is not None
    # A failed job keeps its items, so an operator can queue it again.
    assert scalar(runtime, "SELECT count(*) FROM ingest_job_items") == 2


def test_crashed_attempt_leaves_whole_batches_and_the_retry_skips_them(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    one_doc_batches = with_settings(runtime, ingest_batch_chunks=1)
    items = [text_item(f"d{i}", f"Document {i} is about topic number {i}.") for i in range(3)]
    job_id = enqueue(runtime, items)
    real_write = store.documents.write_documents
    calls = {"n": 0}

    def dying_write(session: Any, **kwargs: Any) -> store.documents.BatchWriteResult:
        calls["n"] += 1
        if calls["n"] == 2:  # the process dies while writing the second batch
            raise KeyboardInterrupt
        return real_write(session, **kwargs)

    monkeypatch.setattr(store.documents, "write_documents", dying_write)
    with pytest.raises(KeyboardInterrupt):
        JobWorker(one_doc_batches, name="crashing").run_once()
    monkeypatch.setattr(store.documents, "write_documents", real_write)
    assert job(runtime, job_id).status == "running"
    assert scalar(runtime, "SELECT string_agg(external_id, ',') FROM documents") == "d0"

    age_heartbeat(runtime, job_id)
    assert JobWorker(one_doc_batches, name="rescuer").run_once()

    done = job(runtime, job_id)
    assert (done.status, done.attempts) == ("done", 2)
    assert (done.counts["unchanged"], done.counts["new"]) == (1, 2)
    assert scalar(runtime, "SELECT count(*) FROM chunks") == 3


def test_a_lost_database_connection_leaves_the_job_to_a_takeover_not_failed(
    runtime: Runtime, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A PostgreSQL restart kills the connection of the cursor a job reads its items through;
    # that shows only at the cursor's next read, when the database may well be back.
    items = [text_item(f"d{i}", f"Document {i} is about topic number {i}.") for i in range(3)]
    job_id = enqueue(runtime, items)
    real_items = store.jobs.job_items

    def cut_after_one(session: Any, claimed_id: uuid.UUID) -> Iterator[store.jobs.JobItem]:
        found = real_items(session, claimed_id)
        yield next(found)
        pid = session.connection().connection.driver_connection.info.backend_pid
        with psycopg.connect(libpq_url(database_url), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        yield from found

    monkeypatch.setattr(store.jobs, "job_items", cut_after_one)
    claimed = claim(runtime, "cut")
    assert claimed is not None
    assert JobWorker(runtime, name="cut").process(claimed) == "stalled"
    monkeypatch.setattr(store.jobs, "job_items", real_items)
    stalled = job(runtime, job_id)
    assert (stalled.status, stalled.attempts, stalled.errors) == ("running", 1, [])

    age_heartbeat(runtime, job_id)
    assert JobWorker(runtime, name="rescuer").run_once()

    done = job(runtime, job_id)
    assert (done.status, done.attempts, done.counts["new"]) == ("done", 2, 3)


def test_job_of_a_deleted_collection_does_not_run(runtime: Runtime) -> None:
    worker = JobWorker(runtime)
    # Deleting the collection deletes its jobs (cascade): the worker lets go, recreates nothing.
    gone = enqueue(runtime, UPLOAD[:2])
    claimed = claim(runtime, worker.name)
    assert claimed is not None and claimed.id == gone
    execute(runtime, "DELETE FROM collections")
    assert worker.process(claimed) == "lost"
    assert scalar(runtime, "SELECT count(*) FROM collections") == 0
    assert scalar(runtime, "SELECT count(*) FROM documents") == 0

    # A job that outlived its collection (collection_id set to NULL) fails and says why.
    orphan = enqueue(runtime, UPLOAD[:2])
    execute(runtime, "UPDATE ingest_jobs SET collection_id = NULL WHERE id = :id", id=orphan)
    assert worker.run_once()
    failed = job(runtime, orphan)
    assert failed.status == "failed"
    assert failed.errors == [{"error": "the job's collection no longer exists"}]
    assert scalar(runtime, "SELECT count(*) FROM documents") == 0


def test_jobs_are_scoped_by_tenant_and_listed_newest_first(runtime: Runtime) -> None:
    tenant = runtime.default_tenant_id
    with runtime.db.write() as session:
        other = session.execute(
            text("INSERT INTO tenants (name) VALUES ('other') RETURNING id")
        ).scalar_one()
    ids = [enqueue(runtime, UPLOAD[:1]) for _ in range(3)]
    elsewhere = enqueue(runtime, UPLOAD[:1], collection="elsewhere")

    with runtime.db.read() as session:
        assert store.jobs.get_job(session, tenant, ids[0]) is not None
        assert store.jobs.get_job(session, other, ids[0]) is None
        assert store.jobs.list_jobs(session, other, limit=10) == []
        page = store.jobs.list_jobs(session, tenant, limit=2)
        rest = store.jobs.list_jobs(session, tenant, limit=2, before=page[-1].id)
        in_uploads = store.jobs.list_jobs(
            session, tenant, collection_id=page[-1].collection_id, limit=10
        )
        assert store.jobs.list_jobs(session, tenant, status="done", limit=10) == []
        assert store.jobs.list_jobs(session, other, limit=10, before=ids[2]) == []

    assert [j.id for j in page] == [elsewhere, ids[2]]
    assert [j.id for j in rest] == [ids[1], ids[0]]
    assert [j.id for j in in_uploads] == [ids[2], ids[1], ids[0]]


def claim_held(
    runtime: Runtime, worker: str, lock: SessionLock, max_attempts: int = 3
) -> store.jobs.ClaimedJob | None:
    """A claim tied to `lock`, as a JobWorker's is (with a heartbeat timeout of a minute)."""
    with runtime.db.write() as session:
        return store.jobs.claim_job(
            session,
            worker=worker,
            stale_after_seconds=60,
            max_attempts=max_attempts,
            hold=lambda: lock.key,
        )


def end_claim_sessions(database_url: str) -> int:
    """Terminate the connections holding claims, as a worker's death ends them."""
    with psycopg.connect(libpq_url(database_url), autocommit=True) as admin:
        ended = admin.execute(
            "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity "
            "WHERE application_name = 'ragservice claim' AND datname = current_database()"
        ).fetchone()
    assert ended is not None
    return int(ended[0])


def test_a_job_whose_claim_session_ended_is_taken_over_at_once(
    runtime: Runtime, database_url: str
) -> None:
    job_id = enqueue(runtime, UPLOAD[:1])
    dying = SessionLock(runtime.db.url)
    rescuer = SessionLock(runtime.db.url)
    try:
        assert claim_held(runtime, "dying", dying) is not None
        assert claim_held(runtime, "rescuer", rescuer) is None  # its holder is connected

        assert end_claim_sessions(database_url) == 2
        rescuer.check()  # the rescuer's own connection comes back, with its lock
        taken = claim_held(runtime, "rescuer", rescuer)  # at once: the heartbeat is fresh
    finally:
        dying.release()
        rescuer.release()
    assert taken is not None
    assert (taken.id, taken.attempts, taken.worker) == (job_id, 2, "rescuer")
    assert job(runtime, job_id).claim_key == rescuer.key
    with runtime.db.write() as session:
        assert not store.jobs.heartbeat_job(session, job_id, "dying")


def test_a_job_whose_claim_ended_on_its_last_attempt_fails_at_once(runtime: Runtime) -> None:
    job_id = enqueue(runtime, UPLOAD[:1])
    with SessionLock(runtime.db.url) as dying:
        assert claim_held(runtime, "dying", dying, max_attempts=1) is not None
    with SessionLock(runtime.db.url) as other:
        assert claim_held(runtime, "other", other, max_attempts=1) is None
    failed = job(runtime, job_id)
    assert (failed.status, failed.attempts, failed.claim_key) == ("failed", 1, None)
    assert failed.errors == [
        {"error": "gave up after 1 attempts: worker dying ended (its database session closed)"}
    ]


def test_a_job_stuck_past_the_stop_goes_back_to_the_queue(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file that parses for longer than the stop may wait: the job is put back in the queue
    from the stopping thread, and the stuck thread lets go of it once it moves on."""
    import ingest.worker

    parsing = threading.Event()
    parsed = threading.Event()
    real_load = ingest.worker._load_item

    def slow_load(*args: Any) -> Any:
        parsing.set()
        parsed.wait(30)
        return real_load(*args)

    monkeypatch.setattr(ingest.worker, "_load_item", slow_load)
    job_id = enqueue(runtime, UPLOAD[:2])
    worker = JobWorker(runtime, threads=1)
    worker.start()
    try:
        assert parsing.wait(30)
        worker.stop(0.2)
        queued = job(runtime, job_id)
    finally:
        parsed.set()
    assert (queued.status, queued.attempts, queued.worker, queued.claim_key) == (
        "queued",
        0,
        None,
        None,
    )
    for thread in threading.enumerate():
        if thread.name.startswith("job-worker"):
            thread.join(30)
    monkeypatch.setattr(ingest.worker, "_load_item", real_load)
    assert JobWorker(runtime).run_once()
    assert (job(runtime, job_id).status, job(runtime, job_id).attempts) == ("done", 1)


def test_stopped_worker_puts_its_job_back_in_the_queue(runtime: Runtime) -> None:
    job_id = enqueue(runtime, UPLOAD[:2])
    stopping = JobWorker(runtime, threads=0)
    claimed = claim(runtime, stopping.name)
    assert claimed is not None
    stopping.stop(0)

    assert stopping.process(claimed) == "queued"
    queued = job(runtime, job_id)
    assert (queued.status, queued.attempts, queued.worker) == ("queued", 0, None)

    assert JobWorker(runtime).run_once()
    assert (job(runtime, job_id).status, job(runtime, job_id).attempts) == ("done", 1)


def test_background_threads_run_jobs_after_wake(runtime: Runtime) -> None:
    # With a one-minute poll, only wake() can make the jobs start within the test's wait.
    worker = JobWorker(with_settings(runtime, job_poll_seconds=60), threads=2)
    worker.start()
    try:
        time.sleep(0.3)  # let the threads' first look at the empty queue pass
        jobs = [enqueue(runtime, UPLOAD[:2]), enqueue(runtime, UPLOAD[2:], collection="other")]
        worker.wake()
        wait_for(lambda: all(job(runtime, j).status == "done" for j in jobs))
    finally:
        worker.stop(10)
    assert [job(runtime, j).counts["new"] for j in jobs] == [2, 1]
    assert not any(t.name.startswith("job-worker") for t in threading.enumerate())


def test_worker_command_runs_until_sigterm(runtime: Runtime) -> None:
    job_id = enqueue(runtime, UPLOAD[:1])
    before = signal.getsignal(signal.SIGTERM)

    def terminate_when_done() -> None:  # a thread of its own: no tenant until it names one
        try:
            with tenancy.as_system():
                wait_for(lambda: job(runtime, job_id).status == "done")
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=terminate_when_done)
    killer.start()
    run_until_signalled(JobWorker(runtime, threads=1), grace_seconds=10)
    killer.join()

    assert job(runtime, job_id).status == "done"
    assert signal.getsignal(signal.SIGTERM) is before


def fail_attempt(runtime: Runtime, job_id: uuid.UUID, worker: str) -> None:
    """A claimed attempt that ends `failed`, its items kept (as a worker's failure does)."""
    claimed = claim(runtime, worker)
    assert claimed is not None and claimed.id == job_id
    with runtime.db.write() as session:
        assert store.jobs.finish_job(
            session,
            job_id,
            status="failed",
            counts={"new": 0},
            errors=[{"error": "boom"}],
            worker=worker,
        )


def retry(runtime: Runtime, job_id: uuid.UUID, tenant_id: uuid.UUID | None = None) -> IngestJob:
    with runtime.db.write() as session:
        return store.jobs.retry_job(session, tenant_id, job_id)


def test_a_failed_job_retried_is_queued_as_new_and_runs(runtime: Runtime) -> None:
    from ragservice.errors import ConflictError, NotFoundError

    worker = JobWorker(runtime, threads=0)
    job_id = enqueue(runtime, UPLOAD[:2])
    fail_attempt(runtime, job_id, worker.name)
    with runtime.db.write() as session:
        other = store.tenants.ensure_tenant(session, "other")
    with pytest.raises(NotFoundError):
        retry(runtime, job_id, other)

    queued = retry(runtime, job_id, runtime.default_tenant_id)
    assert (queued.status, queued.attempts, queued.errors, queued.counts) == ("queued", 0, [], {})
    assert (queued.worker, queued.started_at, queued.finished_at) == (None, None, None)
    assert worker.run_once()
    done = job(runtime, job_id)
    assert (done.status, done.attempts, done.counts["new"]) == ("done", 1, 2)
    with pytest.raises(ConflictError, match="is done; only a failed job can be retried"):
        retry(runtime, job_id)


def test_jobs_that_cannot_be_retried(runtime: Runtime) -> None:
    from ragservice.errors import ConflictError, NotFoundError

    with pytest.raises(NotFoundError):
        retry(runtime, uuid.uuid4())
    purged = enqueue(runtime, UPLOAD[:1])
    fail_attempt(runtime, purged, "w")
    execute(runtime, "DELETE FROM ingest_job_items WHERE job_id = :id", id=purged)
    with pytest.raises(ConflictError, match="upload them again"):
        retry(runtime, purged)
    assert job(runtime, purged).status == "failed"  # left as it was

    with runtime.db.write() as session:
        collection_id = store.collections.ensure_collection(
            session, runtime.default_tenant_id, COLLECTION
        )
        by_cli = store.jobs.start_job(
            session,
            tenant_id=runtime.default_tenant_id,
            collection_id=collection_id,
            kind=store.jobs.CLI_JOB_KIND,
            params={},
            worker="cli",
        )
        store.jobs.finish_job(session, by_cli, status="failed", counts={}, errors=[])
    with pytest.raises(ConflictError, match="run that command again"):
        retry(runtime, by_cli)

    orphan = enqueue(runtime, UPLOAD[:1])
    fail_attempt(runtime, orphan, "w")
    execute(runtime, "UPDATE ingest_jobs SET collection_id = NULL WHERE id = :id", id=orphan)
    with pytest.raises(ConflictError, match="no collection any more"):
        retry(runtime, orphan)
