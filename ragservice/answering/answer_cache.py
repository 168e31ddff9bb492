"""The answer cache's policy: which questions it serves and keeps, under which scope, and what
an entry holds. The scope is computed from the question's resolved search options
(`SearchOptions.scope_parts`) and the answering setup, so a setting that changes results
changes the scope without being listed here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.orm import Session

from ragservice.answering.context import Source
from ragservice.answering.generation import Generated
from ragservice.answering.question import Question, QuestionVector
from ragservice.cache.prompt_cache import (
    CachedAnswer,
    CacheInfo,
    Lookup,
    PromptCache,
    scope_fingerprint,
)
from ragservice.db import tenancy
from ragservice.observability import tracing
from ragservice.retrieval.search import QueryModel, SearchHit


def answer_scope(question: Question, model: QueryModel, answering: Mapping[str, Any]) -> str:
    """The scope a question's answer is cached under: the tenant, its collections, the search
    as it runs on this model (every resolved option, the filter, ef_search for the model's
    storage), the model, and `answering` (reranking, context, prompt, generation)."""
    return scope_fingerprint(
        {
            "tenant": question.tenant_id,
            "collections": sorted(str(c) for c in question.collection_ids),
            "search": question.options.scope_parts(model.storage),
            "embedding_model": model.id,
            "answering": answering,
        }
    )


class AnswerCache:
    """The prompt cache as the answering sequence uses it; `None` cache: nothing is cached."""

    def __init__(self, cache: PromptCache | None) -> None:
        self._cache = cache

    def close(self) -> None:
        if self._cache is not None:
            self._cache.close()

    def caches(self, question: Question) -> bool:
        # A conversation's earlier turns shape its answer: only single questions are cached.
        return self._cache is not None and question.use_cache and not question.history

    def lookup(
        self, question: Question, model: QueryModel, vector: QuestionVector, scope: str
    ) -> Lookup:
        """The cached answer for `question` in `scope`, if any; not consulted for a question
        the cache does not serve, nor (though reported as a miss) for a refresh."""
        if not self.caches(question):
            return Lookup(None)
        if question.refresh_cache:
            return Lookup(info=CacheInfo(hit=False))
        assert self._cache is not None
        with tracing.span("cache_lookup"):
            return self._cache.lookup(
                scope, question.text, vector.get, model_id=model.id, dimension=model.dimension
            )

    def cacheable(
        self, question: Question, sources: Sequence[Source], generated: Generated
    ) -> bool:
        """An answer from a source flagged as instruction-like is never cached: an injection
        that worked would otherwise be replayed to the whole tenant. Nor is an answer built
        from no source for an asker who may not read every document: another asker, who may
        read more, would be told that nothing answers the question. (An entry is served only to
        askers who may read all its sources: migration 0026.)"""
        return (
            self.caches(question)
            and generated.error is None
            and bool(generated.text)
            and not any(source.flagged for source in sources)
            and (bool(sources) or not tenancy.current().restricted)
        )

    def remember(
        self,
        session: Session,
        *,
        question: Question,
        scope: str,
        model: QueryModel,
        vector: QuestionVector,
        hits: Sequence[SearchHit],
        sources: Sequence[Source],
        generated: Generated,
        citations: Sequence[Source],
    ) -> None:
        """Keep the answer, tied to the version of each document its sources came from."""
        assert self._cache is not None
        used = {source.document_id for source in sources}
        versions = {h.document_id: h.document_version for h in hits if h.document_id in used}
        self._cache.put(
            session,
            tenant_id=question.tenant_id,
            scope=scope,
            collection_ids=question.collection_ids,
            prompt=question.text,
            vector=vector.get(),
            model_id=model.id,
            answer=CachedAnswer(
                answer=generated.text,
                model=generated.model,
                status=generated.status,
                cited=tuple(source.number for source in citations),
                sources=tuple(sources),
            ),
            sources=versions,
            replace=question.refresh_cache,
        )
