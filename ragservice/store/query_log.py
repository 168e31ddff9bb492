"""The query log: one row per answered question, and what feedback checks against it.

This module owns the shape of the log's JSON columns: `retrieved` is a list of
`RetrievedChunk` (what retrieval returned, best first) and `citations` a list of `Citation`
(the sources the answer cites). Both are written by `log_query` and read back through
`from_json`; the analytics views (migration 0006) and the export SQL read the same keys.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from ragservice.db.models import QueryLog


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
    id: uuid.UUID = field(default_factory=uuid.uuid4)  # known before the row is written


def log_query(session: Session, record: QueryRecord) -> uuid.UUID:
    entry = QueryLog(
        id=record.id,
        tenant_id=record.tenant_id,
        endpoint=record.endpoint,
        question=record.question,
        collection_ids=list(record.collection_ids),
        params=record.params,
        retrieved=[item.to_json() for item in record.retrieved],
        answer=record.answer,
        citations=[item.to_json() for item in record.citations],
        timings=record.timings,
        upstream_model=record.upstream_model,
        status=record.status,
        error=record.error,
        cache=record.cache,
        messages=record.messages,
    )
    session.add(entry)
    session.flush()
    return entry.id


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
