"""The query path: retrieve → rerank → assemble the context → generate (or extract) → log.

One sequence (`AnswerPipeline.stream`) answers every question: the cache is looked up, or
the sources are retrieved and a `Generation` produces the text as pieces, each cleaned as it
passes; then the answer is logged and (when it may be) cached. `answer` collects that
sequence into a whole answer. The question is embedded at most once per request
(`QuestionVector`); blocking work (the database, the models) runs in worker threads so the
event loop keeps serving other requests meanwhile.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import anyio.to_thread
from sqlalchemy.orm import Session

from ragservice import store
from ragservice.answering.answer_cache import AnswerCache, answer_scope
from ragservice.answering.context import Context, Source, assemble_context, citation_markers
from ragservice.answering.generation import (
    EXTRACTIVE_MODEL,
    Completed,
    Fallback,
    Generated,
    Generation,
    Streamed,
    UpstreamPolicy,
    extractive,
)
from ragservice.answering.inference import InferenceClient
from ragservice.answering.prompt import ChatMessage, build_messages
from ragservice.answering.query_record import Answered, QueryLog, query_record
from ragservice.answering.question import AnswerStatus, Question, QuestionVector
from ragservice.cache.prompt_cache import CacheInfo, Lookup, PromptCache
from ragservice.config import AnsweringSettings, InferenceSettings
from ragservice.db import Database
from ragservice.metrics import Metrics
from ragservice.retrieval.rerank import Reranker, rerank_hits
from ragservice.retrieval.search import Mode, QueryModel, Searcher, SearchHit
from ragservice.safety.html import AnswerText
from ragservice.safety.sources import new_tag
from ragservice.timing import ms_since, timed

__all__ = ["EXTRACTIVE_MODEL", "Answer", "AnswerPipeline"]


class AnswerModel(QueryModel, Protocol):
    """The embedding model one question is answered with (see `registry.ServingModel`)."""

    def count_tokens(self, text: str) -> int: ...


@dataclass
class Answer:
    query_id: uuid.UUID
    text: str
    citations: list[Source]  # the sources the answer cites
    sources: list[Source]
    model: str
    status: AnswerStatus
    timings_ms: dict[str, float]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    cache: CacheInfo | None = None


@dataclass
class _Prepared:
    """What the answer is built from: the hits in context order and the assembled context
    (or a cached answer's sources), the model, the question's vector and the timings so far."""

    hits: list[SearchHit]
    context: Context
    model: AnswerModel
    vector: QuestionVector
    scope: str
    timings: dict[str, float] = field(default_factory=dict)
    cache: CacheInfo | None = None
    # The sources block's tag, fresh for each question (see `safety.sources`).
    tag: str = field(default_factory=new_tag)


class AnswerPipeline:
    def __init__(
        self,
        *,
        db: Database,
        searcher: Searcher,
        models: Callable[[], AnswerModel],
        answering: AnsweringSettings,
        inference_settings: InferenceSettings,
        reranker: Reranker | None = None,
        inference: InferenceClient | None = None,
        metrics: Metrics | None = None,
        cache: PromptCache | None = None,
    ) -> None:
        """`models` gives the embedding model to serve; each question calls it once and keeps
        that model throughout (cache scope, lookup, search, store)."""
        self._db = db
        self._cache = AnswerCache(cache)
        self._models = models
        self._searcher = searcher
        self._answering = answering
        self._inference_settings = inference_settings
        self._reranker = reranker
        self._inference = inference
        self._metrics = metrics
        self._upstream = UpstreamPolicy(metrics)
        self._log = QueryLog(metrics)
        # Links to other hosts and active HTML are taken out of every answer (`safety`).
        self._text = AnswerText(answering.link_host_names(), answering.html)

    def close(self) -> None:
        self._cache.close()

    @property
    def model_name(self) -> str:
        return self._inference_settings.model if self._inference else EXTRACTIVE_MODEL

    async def answer(self, question: Question) -> Answer:
        """The whole answer: the sequence of `stream`, collected (one completion upstream)."""
        async for item in self._sequence(question, live=False):
            if isinstance(item, Answer):
                return item
        raise AssertionError("an answering sequence ends with its answer")

    def stream(self, question: Question) -> AsyncGenerator[str | Answer, None]:
        """Content pieces as they are generated (cleaned), then the finished `Answer` last."""
        return self._sequence(question, live=True)

    async def _sequence(
        self, question: Question, *, live: bool
    ) -> AsyncGenerator[str | Answer, None]:
        started = time.perf_counter()
        model = self._models()
        vector = QuestionVector(model, question.text)
        scope = answer_scope(question, model, self._answer_setup(question))
        lookup = await anyio.to_thread.run_sync(self._cache.lookup, question, model, vector, scope)
        if lookup.answer is not None:
            prepared = _replayed(lookup, model, vector, scope)
            generation = self._replay(lookup)
            async for text in self._cleaned(generation):
                yield text
        else:
            prepared = await anyio.to_thread.run_sync(
                self._prepare, question, lookup, model, vector, scope
            )
            with timed(prepared.timings, "generate"):
                generation = self._generation(question, prepared, live=live)
                async for text in self._cleaned(generation):
                    yield text
        generated = replace(generation.result, text=self._text.clean(generation.result.text))
        yield await self._finish(question, prepared, generated, started, lookup)

    async def _cleaned(self, generation: Generation) -> AsyncGenerator[str, None]:
        """The generation's text, cleaned (`safety`): a live one piece by piece as it passes,
        a finished one whole, then split."""
        if not generation.live:
            for piece in generation.split(self._text.clean(generation.result.text)):
                yield piece
            return
        shown = self._text.stream()
        async for piece in generation.pieces():
            if text := shown.feed(piece):
                yield text
        if text := shown.finish():
            yield text

    def _answer_setup(self, question: Question) -> dict[str, Any]:
        """What shapes an answer beyond the search, for its cache scope: every answering
        setting (rerank, context, prompt, …; a new one is in the scope without being named
        here), whether this question is reranked, the model and the sampling."""
        return {
            "settings": self._answering.model_dump(mode="json"),
            "reranked": self._reranks(question),
            "model": self.model_name,
            "sampling": list(self._sampling(question)),
        }

    # -- retrieval -------------------------------------------------------------------------------

    def _prepare(
        self,
        question: Question,
        lookup: Lookup,
        model: AnswerModel,
        vector: QuestionVector,
        scope: str,
    ) -> _Prepared:
        timings = {} if lookup.info is None else {"cache_lookup": lookup.elapsed_ms}
        if self._cache.caches(question) or question.options.mode is not Mode.FULLTEXT:
            vector.get()  # searched with, or kept with the answer
        if vector.computed is not None:
            timings["embed"] = vector.embed_ms
        hits = self._retrieve(question, timings, vector, model)
        if self._reranks(question) and hits:
            assert self._reranker is not None
            with timed(timings, "rerank"):
                hits = rerank_hits(self._reranker, question.text, hits, question.options.k)
        with timed(timings, "context"):
            neighbours = self._searcher.neighbours(hits, self._answering.context_neighbours)
            context = assemble_context(
                hits,
                count_tokens=model.count_tokens,
                budget_tokens=self._answering.context_max_tokens,
                neighbours=neighbours,
            )
        return _Prepared(
            hits=hits,
            context=context,
            model=model,
            vector=vector,
            scope=scope,
            timings=timings,
            cache=lookup.info,
        )

    def _retrieve(
        self,
        question: Question,
        timings: dict[str, float],
        vector: QuestionVector,
        model: AnswerModel,
    ) -> list[SearchHit]:
        options = question.options
        if self._reranks(question):
            options = replace(options, k=max(options.k, self._answering.rerank_candidates))
        result = self._searcher.search(
            collection_ids=question.collection_ids,
            query=question.text,
            options=options,
            vector=vector.computed,
            model=model,
        )
        timings["search"] = result.timings_ms.get("total", 0.0)
        return result.hits

    def _reranks(self, question: Question) -> bool:
        return self._reranker is not None and question.rerank is not False

    # -- generation ------------------------------------------------------------------------------

    def _generation(self, question: Question, prepared: _Prepared, *, live: bool) -> Generation:
        if self._inference is None:
            return Generation(extractive(prepared.context))
        kind = Streamed if live else Completed
        return kind(
            self._inference,
            self._messages(question, prepared),
            sampling=self._sampling(question),
            model=self.model_name,
            on_failure=Fallback(
                self._upstream, prepared.context, fallback=question.fallback_extractive
            ),
        )

    def _replay(self, lookup: Lookup) -> Generation:
        """A cached answer, given in word-sized pieces as a live one would arrive; cleaned
        again on the way, since the allowed hosts or the HTML setting may have changed."""
        assert lookup.answer is not None
        cached = lookup.answer
        generated = Generated(
            text=cached.answer, model=cached.model or self.model_name, status=cached.status
        )
        return Generation(generated, word_sized=True)

    def _messages(self, question: Question, prepared: _Prepared) -> list[ChatMessage]:
        return build_messages(
            question.text,
            prepared.context.text,
            system_prompt=self._answering.system_prompt,
            history=question.history,
            tag=prepared.tag,
        )

    def _sampling(self, question: Question) -> tuple[int, float]:
        """max_tokens and temperature: the caller's, else the configured ones."""
        temperature = question.temperature
        if temperature is None:
            temperature = self._inference_settings.temperature
        return question.max_tokens or self._inference_settings.max_tokens, temperature

    # -- the answer ------------------------------------------------------------------------------

    async def _finish(
        self,
        question: Question,
        prepared: _Prepared,
        generated: Generated,
        started: float,
        lookup: Lookup,
    ) -> Answer:
        citations = _citations(generated, prepared.context)
        timings = {**prepared.timings, "total": ms_since(started)}
        messages = self._messages(question, prepared) if prepared.context.text else None
        answered = Answered(
            question=question,
            model_id=prepared.model.id,
            hits=prepared.hits,
            sources=prepared.context.sources,
            generated=generated,
            citations=citations,
            timings=timings,
            messages=messages,
            cache=prepared.cache,
        )
        remember = lookup.answer is None and self._cache.cacheable(
            question, prepared.context.sources, generated
        )
        record = query_record(answered)
        await anyio.to_thread.run_sync(self._keep, record, answered, prepared, remember)
        if self._metrics is not None:
            self._metrics.observe_stages(timings)
            self._metrics.tokens_generated.inc(generated.completion_tokens)
        return Answer(
            query_id=record.id,
            text=generated.text,
            citations=citations,
            sources=prepared.context.sources,
            model=generated.model,
            status=generated.status,
            timings_ms={name: round(ms, 2) for name, ms in timings.items()},
            prompt_tokens=generated.prompt_tokens,
            completion_tokens=generated.completion_tokens,
            error=generated.error,
            cache=prepared.cache,
        )

    def _keep(
        self,
        record: store.query_log.QueryRecord,
        answered: Answered,
        prepared: _Prepared,
        remember: bool,
    ) -> None:
        """Log the query and cache the answer on the primary, after the response is sent
        (`Database.write_later`): the caller never waits on either."""
        self._db.write_later(lambda session: self._log.write(session, record))
        if remember:
            self._db.write_later(lambda session: self._remember(session, answered, prepared))

    def _remember(self, session: Session, answered: Answered, prepared: _Prepared) -> None:
        self._cache.remember(
            session,
            question=answered.question,
            scope=prepared.scope,
            model=prepared.model,
            vector=prepared.vector,
            hits=prepared.hits,
            sources=answered.sources,
            generated=answered.generated,
            citations=answered.citations,
        )


def _replayed(lookup: Lookup, model: AnswerModel, vector: QuestionVector, scope: str) -> _Prepared:
    """A cached answer's sources, as the answer's context."""
    assert lookup.answer is not None
    timings = {"cache_lookup": lookup.elapsed_ms}
    if vector.computed is not None:
        timings["embed"] = vector.embed_ms
    sources = list(lookup.answer.sources)
    return _Prepared(
        hits=[],
        context=Context(sources=sources, text="", token_count=0, dropped=0),
        model=model,
        vector=vector,
        scope=scope,
        timings=timings,
        cache=lookup.info,
    )


def _citations(generated: Generated, context: Context) -> list[Source]:
    """The sources the answer cites, in source order (an extractive answer cites what it shows)."""
    cited = set(citation_markers(generated.text))
    return [source for source in context.sources if source.number in cited]
