"""The retention purge (query log with its feedback, job payloads), `ragservice db purge`, and
a logged answer whose source was deleted before the log row was written."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update

from ragservice import store
from ragservice.db import tenancy
from ragservice.db.models import Feedback, IngestJob, IngestJobItem, QueryLog
from ragservice.retention import PurgeReport, purge_retention
from ragservice.runtime import Runtime


def log(
    runtime: Runtime, *, days_old: float, documents: list[uuid.UUID] | None = None
) -> uuid.UUID:
    record = store.query_log.QueryRecord(
        tenant_id=runtime.default_tenant_id,
        endpoint="query",
        question="q",
        collection_ids=[],
        params={},
        retrieved=[],
        answer="the answer",
        citations=[],
        timings={},
        upstream_model=None,
        status="ok",
        messages=[{"role": "user", "content": "q"}],
        source_document_ids=documents or [],
    )
    with tenancy.as_system(), runtime.db.write() as session:
        store.query_log.log_query(session, record)
        age = func.now() - timedelta(days=days_old)
        session.execute(update(QueryLog).where(QueryLog.id == record.id).values(created_at=age))
        store.feedback.add_feedback(
            session,
            store.feedback.NewFeedback(
                query_id=record.id,
                tenant_id=runtime.default_tenant_id,
                rating=1,
                scale="thumbs",
                comment=None,
                corrected_answer=None,
                relevant_chunk_ids=[],
                irrelevant_chunk_ids=[],
            ),
        )
    return record.id


def job(runtime: Runtime, status: str, *, hours_ago: float) -> uuid.UUID:
    item = store.jobs.JobItem(kind="text", name="a", title=None, body=b"uploaded text")
    with tenancy.as_system(), runtime.db.write() as session:
        cid = store.collections.ensure_collection(session, runtime.default_tenant_id, "c")
        job_id = store.jobs.enqueue_job(
            session,
            tenant_id=runtime.default_tenant_id,
            collection_id=cid,
            kind=store.jobs.CLI_JOB_KIND,
            params={},
            items=[item, item],
        )
        if status != "queued":
            ended = func.now() - timedelta(hours=hours_ago)
            values: dict[str, Any] = {"status": status, "finished_at": ended}
            session.execute(update(IngestJob).where(IngestJob.id == job_id).values(**values))
    return job_id


def remaining(runtime: Runtime) -> tuple[set[uuid.UUID], int, set[uuid.UUID]]:
    """(logged queries, feedback rows, jobs that still hold items)"""
    with tenancy.as_system(), runtime.db.read() as session:
        queries = set(session.scalars(select(QueryLog.id)))
        feedback = session.scalar(select(func.count()).select_from(Feedback)) or 0
        jobs = set(session.scalars(select(IngestJobItem.job_id).distinct()))
    return queries, feedback, jobs


def test_the_purge_deletes_what_is_past_retention_only(runtime: Runtime) -> None:
    old, fresh = log(runtime, days_old=31), log(runtime, days_old=29)
    failed_long_ago = job(runtime, "failed", hours_ago=25)
    failed_lately = job(runtime, "failed", hours_ago=23)
    queued_long_ago = job(runtime, "queued", hours_ago=0)
    with tenancy.as_system(), runtime.db.write() as session:
        ago = func.now() - timedelta(days=30)
        session.execute(
            update(IngestJob).where(IngestJob.id == queued_long_ago).values(created_at=ago)
        )

    report = purge_retention(runtime.db, runtime.settings.retention, query_log_days=30)

    assert report == PurgeReport(queries=1, feedback=1, job_items=2)
    queries, feedback, jobs = remaining(runtime)
    assert queries == {fresh} and old not in queries
    assert feedback == 1
    assert jobs == {failed_lately, queued_long_ago} and failed_long_ago not in jobs
    # Retention 0 keeps the query log for ever; a second round finds nothing more.
    forever = purge_retention(runtime.db, runtime.settings.retention, query_log_days=0)
    assert forever == PurgeReport()
    assert remaining(runtime)[0] == {fresh}


def test_db_purge_prints_the_counts(
    runtime: Runtime, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from ragservice.cli import app
    from ragservice.config import get_settings

    log(runtime, days_old=100)
    log(runtime, days_old=1)
    job(runtime, "failed", hours_ago=2)
    monkeypatch.setenv("RAGSERVICE_DATABASE_URL", database_url)
    monkeypatch.setenv("RAGSERVICE_QUERY_LOG_RETENTION_DAYS", "90")
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(app, ["db", "purge", "--job-payload-hours", "1"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["query_log\t1", "feedback\t1", "ingest_job_items\t2"]
    assert len(remaining(runtime)[0]) == 1


def test_an_answer_logged_after_its_source_was_deleted_is_redacted(runtime: Runtime) -> None:
    kept = log(runtime, days_old=0)
    gone = log(runtime, days_old=0, documents=[uuid.uuid4()])
    with tenancy.as_system(), runtime.db.read() as session:
        rows = {row.id: row for row in session.scalars(select(QueryLog))}
    assert (rows[kept].answer, rows[kept].redacted_at) == ("the answer", None)
    assert rows[gone].answer is None and rows[gone].messages is None
    assert rows[gone].redacted_at is not None
    assert rows[gone].question == "q"
