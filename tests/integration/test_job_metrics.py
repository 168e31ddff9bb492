"""Job and queue metrics against a real PostgreSQL: what the worker counts as it runs jobs, and
the queue depth a scrape reads."""

from __future__ import annotations

from ingest.worker import JobWorker
from ragservice import store
from ragservice.metrics import WorkerMetrics
from ragservice.runtime import Runtime
from ragservice.runtime_metrics import runtime_collectors
from tests.integration.test_jobs import UPLOAD, enqueue, job, text_item


def test_the_worker_counts_claims_outcomes_and_documents(runtime: Runtime) -> None:
    metrics = WorkerMetrics()
    sample = metrics.registry.get_sample_value
    job_id = enqueue(runtime, UPLOAD)
    worker = JobWorker(runtime, metrics=metrics.jobs)

    assert worker.run_once()
    assert not worker.run_once()  # an empty queue claims nothing

    assert job(runtime, job_id).status == "done"
    assert sample("ragservice_jobs_claimed_total", {"kind": "upload"}) == 1
    assert sample("ragservice_jobs_finished_total", {"kind": "upload", "outcome": "done"}) == 1
    assert sample("ragservice_job_seconds_count", {"kind": "upload", "outcome": "done"}) == 1
    assert sample("ragservice_job_documents_total", {"result": "new"}) == 3
    assert sample("ragservice_job_documents_total", {"result": "failed"}) == 1
    assert (sample("ragservice_job_chunks_embedded_total") or 0) >= 3
    assert sample("ragservice_jobs_running") == 0


def test_a_stopped_worker_counts_its_job_put_back(runtime: Runtime) -> None:
    metrics = WorkerMetrics()
    enqueue(runtime, UPLOAD[:1])
    stopping = JobWorker(runtime, threads=0, metrics=metrics.jobs)
    with runtime.db.write() as session:
        claimed = store.jobs.claim_job(
            session, worker=stopping.name, stale_after_seconds=60, max_attempts=3
        )
    assert claimed is not None
    stopping.stop(0)

    assert stopping.process(claimed) == "queued"
    labels = {"kind": "upload", "outcome": "queued"}
    assert metrics.registry.get_sample_value("ragservice_jobs_finished_total", labels) == 1
    assert metrics.registry.get_sample_value("ragservice_jobs_running") == 0


def test_queue_depth_counts_queued_jobs_and_their_items(runtime: Runtime) -> None:
    metrics = WorkerMetrics()
    unwatch = metrics.watch(runtime_collectors(runtime))
    enqueue(runtime, UPLOAD[:2])
    enqueue(runtime, [text_item("a", "Alpha."), text_item("b", "Beta."), text_item("c", "C.")])
    running = enqueue(runtime, UPLOAD[2:3])
    with runtime.db.write() as session:  # claimed: no longer waiting
        claimed = store.jobs.claim_job(session, worker="w", stale_after_seconds=60, max_attempts=3)
    assert claimed is not None and claimed.id != running  # the oldest first
    with runtime.db.write() as session:  # a CLI job runs in its own process: never queued
        collection_id = store.collections.ensure_collection(
            session, runtime.default_tenant_id, "cli"
        )
        store.jobs.start_job(
            session,
            tenant_id=runtime.default_tenant_id,
            collection_id=collection_id,
            kind=store.jobs.CLI_JOB_KIND,
            params={},
            worker="cli",
        )

    text = metrics.exposition().decode()

    assert "ragservice_ingest_queue_jobs 2.0" in text
    assert "ragservice_ingest_queue_items 4.0" in text
    assert "ragservice_embedding_waiting 0.0" in text
    assert "process_cpu_seconds_total" in text
    unwatch()
    assert "ragservice_ingest_queue_jobs" not in metrics.exposition().decode()
