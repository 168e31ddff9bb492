"""The query log: one row per answered question, and what feedback checks against it.

This module owns the shape of the log's JSON columns: `retrieved` is a list of
`RetrievedChunk` (what retrieval returned, best first) and `citations` a list of `Citation`
(the sources the answer cites). Both are written by `log_query` and read back through
`from_json`; the analytics views (migration 0006) and the export SQL read the same keys.

`request_id` and `trace_id` tie a row to the request's log lines and its trace.

`source_document_ids` names every document an answer drew on; deleting one of them redacts
the row (`answer` and `messages` set to NULL, `redacted_at` set) in the same transaction, by
a trigger (migration 0012). `purge_query_log` deletes rows past the retention.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy import func, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from ragservice.db.models import Document, QueryLog
from ragservice.limits.text import storable_json, storable_text


@dataclass(frozen=True, slots=True)
class RetrievedChunk:
    """One element of `query_log.retrieved`."""

    chunk_id: uuid.UUID
    document_id: uuid.UUID
    score: float

    def to_json(self) -> dict[str, Any]:
        return {
            "chunk_id": str(self.chunk_id),
            "document_id": str(self.document_id),
            "score": self.score,
        }

    @classmethod
    def from_json(cls, item: dict[str, Any]) -> RetrievedChunk:
        return cls(
            uuid.UUID(item["chunk_id"]), uuid.UUID(item["document_id"]), float(item["score"])
        )


@dataclass(frozen=True, slots=True)
class Citation:
    """One element of `query_log.citations`: source `number` of the context, its document and
    the chunks it was assembled from."""

    number: int
    document_id: uuid.UUID
    chunk_ids: tuple[uuid.UUID, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "document_id": str(self.document_id),
            "chunk_ids": [str(i) for i in self.chunk_ids],
        }

    @classmethod
    def from_json(cls, item: dict[str, Any]) -> Citation:
        chunk_ids = tuple(uuid.UUID(i) for i in item.get("chunk_ids", ()))
        return cls(int(item["number"]), uuid.UUID(item["document_id"]), chunk_ids)


@dataclass(frozen=True, slots=True)
class QueryRecord:
    """One answered question as the query log keeps it."""

    tenant_id: uuid.UUID
    endpoint: str
    question: str
    collection_ids: Sequence[uuid.UUID]
    params: dict[str, Any]
    retrieved: Sequence[RetrievedChunk]
    answer: str | None
    citations: Sequence[Citation]
    timings: dict[str, float]
    upstream_model: str | None
    status: str
    error: str | None = None
    cache: dict[str, Any] | None = None
    messages: list[dict[str, Any]] | None = None  # the prompt the answer was generated from
    # Documents the answer drew on beyond `retrieved` and `citations` (a cached answer's sources)
    source_document_ids: Sequence[uuid.UUID] = ()
    request_id: str | None = None  # the HTTP request's `X-Request-ID`
    asker: str | None = None  # who asked: `user:<name>` or `key:<prefix>`
    trace_id: str | None = None  # its OpenTelemetry trace, while tracing is on
    id: uuid.UUID = field(default_factory=uuid.uuid4)  # known before the row is written


def log_query(session: Session, record: QueryRecord) -> uuid.UUID:
    """Write the row. When a source document is gone (deleted while the question was being
    answered) the answer and prompt are left out, as the delete would have redacted them.

    Text that PostgreSQL cannot hold (a NUL character, a lone surrogate in a conversation's
    earlier turn) is stored with U+FFFD in its place: an answered question is always logged."""
    sources = source_document_ids(record)
    redact = bool(sources) and not _sources_present(session, record.tenant_id, sources)
    entry = QueryLog(
        id=record.id,
        tenant_id=record.tenant_id,
        endpoint=record.endpoint,
        question=storable_text(record.question),
        collection_ids=list(record.collection_ids),
        params=storable_json(record.params),
        retrieved=[item.to_json() for item in record.retrieved],
        answer=None if redact or record.answer is None else storable_text(record.answer),
        citations=[item.to_json() for item in record.citations],
        timings=record.timings,
        upstream_model=_storable_or_none(record.upstream_model),
        status=record.status,
        error=_storable_or_none(record.error),
        cache=storable_json(record.cache),
        messages=None if redact else storable_json(record.messages),
        source_document_ids=sources,
        redacted_at=func.now() if redact else None,
        request_id=record.request_id,
        asker=record.asker,
        trace_id=record.trace_id,
    )
    session.add(entry)
    session.flush()
    return entry.id


def _storable_or_none(value: str | None) -> str | None:
    return None if value is None else storable_text(value)


def source_document_ids(record: QueryRecord) -> list[uuid.UUID]:
    """Every document the record's answer drew on, sorted."""
    ids = {item.document_id for item in record.retrieved}
    ids.update(item.document_id for item in record.citations)
    ids.update(record.source_document_ids)
    return sorted(ids)


def _sources_present(session: Session, tenant_id: uuid.UUID, ids: Sequence[uuid.UUID]) -> bool:
    """Whether every document still exists. They stay locked (FOR KEY SHARE) until the
    transaction ends, so a delete waits for the row to be written and then redacts it. (The
    tenant named: on Citus row locks are taken on one tenant's shard only.)"""
    stmt = (
        select(Document.id)
        .where(Document.tenant_id == tenant_id, Document.id.in_(list(ids)))
        .order_by(Document.id)
        .with_for_update(read=True, key_share=True)
    )
    try:
        with session.begin_nested():
            session.execute(text("SET LOCAL lock_timeout = '2s'"))
            found = set(session.scalars(stmt))
    except OperationalError as exc:
        if not isinstance(exc.orig, psycopg.errors.LockNotAvailable):
            raise
        return False  # a delete holds a source: keep nothing of the sources' text
    return len(found) == len(set(ids))


_PURGE = text("""
WITH old AS (
    SELECT id FROM query_log
    WHERE created_at < now() - make_interval(days => :days)
    ORDER BY created_at LIMIT :limit
), gone_feedback AS (
    DELETE FROM feedback f USING old WHERE f.query_id = old.id RETURNING 1
), gone AS (
    DELETE FROM query_log q USING old WHERE q.id = old.id RETURNING 1
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM gone_feedback)
""")


def purge_query_log(session: Session, *, older_than_days: int, limit: int) -> tuple[int, int]:
    """Delete up to `limit` logged queries older than `older_than_days`, oldest first, with
    their feedback; returns (queries, feedback rows) deleted."""
    row = session.execute(_PURGE, {"days": older_than_days, "limit": limit}).one()
    return int(row[0]), int(row[1])


@dataclass(frozen=True, slots=True)
class LoggedQuery:
    """What feedback on an answer is checked against."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    collection_ids: list[uuid.UUID]


def get_logged_query(
    session: Session, tenant_id: uuid.UUID, query_id: uuid.UUID
) -> LoggedQuery | None:
    """The tenant's logged answer `query_id`; None for another tenant's, as for a missing one."""
    row = session.execute(
        select(QueryLog.id, QueryLog.tenant_id, QueryLog.collection_ids).where(
            QueryLog.id == query_id, QueryLog.tenant_id == tenant_id
        )
    ).first()
    return None if row is None else LoggedQuery(row[0], row[1], list(row[2]))


_CHUNKS_OUTSIDE_QUERY = text("""
SELECT u.id
FROM query_log q, unnest(CAST(:ids AS uuid[])) WITH ORDINALITY AS u(id, n)
WHERE q.id = :query AND q.tenant_id = :tenant
  AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(q.retrieved) AS r(item)
                  WHERE r.item ->> 'chunk_id' = CAST(u.id AS text))
  AND NOT EXISTS (SELECT 1 FROM chunks c
                  WHERE c.id = u.id AND c.tenant_id = q.tenant_id
                    AND c.collection_id = ANY(q.collection_ids))
ORDER BY u.n
""")


def chunks_outside_query(
    session: Session, query: LoggedQuery, chunk_ids: Sequence[uuid.UUID]
) -> list[uuid.UUID]:
    """The ids among `chunk_ids` that were not retrieved for the query and are not chunks of
    the query's tenant in one of its collections, in the order given."""
    if not chunk_ids:
        return []
    params = {"ids": list(chunk_ids), "query": query.id, "tenant": query.tenant_id}
    return list(session.scalars(_CHUNKS_OUTSIDE_QUERY, params))
