"""The query log's record of one answer, and its write: in a savepoint of its own, a failure
counted (`ragservice_query_log_write_failures_total`) and logged without the question."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from ragservice import store
from ragservice.answering.context import Source
from ragservice.answering.generation import EXTRACTIVE_MODEL, Generated
from ragservice.answering.prompt import ChatMessage
from ragservice.answering.question import Question
from ragservice.cache.prompt_cache import CacheInfo
from ragservice.db import error_summary
from ragservice.db.scope import current_asker
from ragservice.metrics import Metrics
from ragservice.observability import logs, tracing
from ragservice.retrieval.search import SearchHit

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Answered:
    """What one question led to, as the log keeps it."""

    question: Question
    model_id: int
    hits: Sequence[SearchHit]
    sources: Sequence[Source]
    generated: Generated
    citations: Sequence[Source]
    timings: dict[str, float]
    messages: Sequence[ChatMessage] | None
    cache: CacheInfo | None


def query_record(answered: Answered) -> store.query_log.QueryRecord:
    question, generated = answered.question, answered.generated
    return store.query_log.QueryRecord(
        tenant_id=question.tenant_id,
        endpoint=question.endpoint,
        question=question.text,
        collection_ids=list(question.collection_ids),
        params={
            "mode": str(question.options.mode),
            "k": question.options.k,
            "rerank": question.rerank,
            "filtered": question.options.filters is not None,
            "embedding_model": answered.model_id,
        },
        retrieved=[
            store.query_log.RetrievedChunk(h.chunk_id, h.document_id, h.score)
            for h in answered.hits
        ],
        answer=generated.text,
        citations=[
            store.query_log.Citation(c.number, c.document_id, tuple(c.chunk_ids))
            for c in answered.citations
        ],
        timings=answered.timings,
        upstream_model=None if generated.model == EXTRACTIVE_MODEL else generated.model,
        status=generated.status,
        error=generated.error,
        cache=None if answered.cache is None else answered.cache.to_dict(),
        messages=None if answered.messages is None else [m.to_dict() for m in answered.messages],
        source_document_ids=[source.document_id for source in answered.sources],
        request_id=logs.current_request_id(),
        trace_id=tracing.current_trace_id(),
        asker=current_asker(),
    )


class QueryLog:
    """Writes query records; a failed write never fails the answer it records."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self._metrics = metrics

    def write(self, session: Session, record: store.query_log.QueryRecord) -> None:
        try:
            with session.begin_nested():
                store.query_log.log_query(session, record)
        except Exception as exc:
            if self._metrics is not None:
                self._metrics.query_log_failures.inc()
            log.error("query log write of %s failed: %s", record.id, error_summary(exc))
