"""Answers, as every interface asks for them: the question's search resolved (options, filter,
the caller's collections) into a `Question`, then the one answering sequence
(`AnswerPipeline`), whole or streamed. The REST routers (`/v1/query`, chat completions) and
`ragservice ask` call these."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

import anyio.to_thread

from ragservice.answering.answer import Answer, AnswerPipeline
from ragservice.answering.inference import InferenceClient
from ragservice.answering.prompt import ChatMessage
from ragservice.answering.question import Question
from ragservice.cache.prompt_cache import PromptCache
from ragservice.config import LimitSettings, SearchSettings, Settings
from ragservice.db import Database
from ragservice.embedding.registry import ModelRegistry
from ragservice.limits.request_bounds import check_query
from ragservice.metrics import Metrics
from ragservice.retrieval.rerank import make_reranker
from ragservice.retrieval.reranker_registry import registered_folder
from ragservice.retrieval.search import Searcher
from ragservice.services.search import (
    SearchQuery,
    collection_ids,
    resolve_options,
)


@dataclass(frozen=True)
class AskQuery:
    """What a caller asks: the question, where and how to search, and how to answer."""

    search: SearchQuery
    rerank: bool | None = None
    fallback_extractive: bool = False
    use_cache: bool = True
    refresh_cache: bool = False
    history: Sequence[ChatMessage] = ()
    endpoint: str = "query"
    max_tokens: int | None = None
    temperature: float | None = None


def open_pipeline(
    db: Database,
    models: ModelRegistry,
    settings: Settings,
    *,
    searcher: Searcher,
    inference: InferenceClient | None,
    metrics: Metrics,
) -> AnswerPipeline:
    """The query path, with the reranker (loaded here) and the inference client if configured."""
    reranker = make_reranker(settings, resolve=lambda ref: registered_folder(db, ref))
    if reranker is not None:
        reranker.warm_up()
    cache = None
    if settings.cache.enabled:
        cache = PromptCache(db, cache=settings.cache, metrics=metrics)
    return AnswerPipeline(
        db=db,
        searcher=searcher,
        models=models.current,
        answering=settings.answering,
        inference_settings=settings.inference,
        reranker=reranker,
        inference=inference,
        metrics=metrics,
        cache=cache,
    )


class AnswerService:
    """Answers of one process: its database, settings and answering pipeline."""

    def __init__(
        self,
        db: Database,
        *,
        search: SearchSettings,
        limits: LimitSettings,
        pipeline: AnswerPipeline,
    ) -> None:
        self._db = db
        self._search = search
        self._limits = limits
        self._pipeline = pipeline

    @property
    def pipeline(self) -> AnswerPipeline:
        return self._pipeline

    def check(self, ask: AskQuery, *, field: str) -> None:
        """The limits on the question and k (before the caller is charged for an answer)."""
        check_query(ask.search.text, ask.search.k, self._limits, field=field)

    async def question(self, tenant_id: uuid.UUID, ask: AskQuery) -> Question:
        """The question `ask` makes, its search resolved and its collections the tenant's."""
        options = resolve_options(ask.search, self._search)
        ids = await anyio.to_thread.run_sync(
            collection_ids, self._db, tenant_id, ask.search.collections
        )
        return Question(
            text=ask.search.text,
            tenant_id=tenant_id,
            collection_ids=ids,
            options=options,
            rerank=ask.rerank,
            fallback_extractive=ask.fallback_extractive,
            history=ask.history,
            endpoint=ask.endpoint,
            max_tokens=ask.max_tokens,
            temperature=ask.temperature,
            use_cache=ask.use_cache,
            refresh_cache=ask.refresh_cache,
        )

    async def answer(self, tenant_id: uuid.UUID, ask: AskQuery) -> Answer:
        return await self._pipeline.answer(await self.question(tenant_id, ask))

    async def stream(
        self, tenant_id: uuid.UUID, ask: AskQuery
    ) -> AsyncGenerator[str | Answer, None]:
        """The answer's pieces as they are generated, then the whole `Answer`."""
        return self._pipeline.stream(await self.question(tenant_id, ask))
