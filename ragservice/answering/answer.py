"""The query path: retrieve → rerank → assemble the context → generate (or extract) → log.

`AnswerPipeline.answer` returns a whole answer; `AnswerPipeline.stream` yields the tokens as
the inference layer produces them, then the finished answer. Blocking work (the database, the
models) runs in worker threads so the event loop keeps serving other requests meanwhile.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

import anyio.to_thread
import numpy as np
import numpy.typing as npt
from sqlalchemy.orm import Session

from ragservice import store
from ragservice.answering.context import (
    Context,
    Source,
    assemble_context,
    citation_markers,
    source_from_json,
    source_to_json,
)
from ragservice.answering.context import extractive_answer as extract
from ragservice.answering.inference import Completion, InferenceClient
from ragservice.answering.prompt import ChatMessage, build_messages
from ragservice.cache.prompt_cache import CacheInfo, Lookup, PromptCache, scope_fingerprint
from ragservice.config import Settings
from ragservice.db import Database, error_summary
from ragservice.errors import UpstreamError, UpstreamTimeoutError
from ragservice.metrics import Metrics
from ragservice.observability import logs, tracing
from ragservice.retrieval.rerank import Reranker, rerank_hits
from ragservice.retrieval.search import QueryModel, Searcher, SearchHit, SearchOptions
from ragservice.safety.html import AnswerText
from ragservice.safety.sources import new_tag
from ragservice.timing import add_ms, ms_since, timed

log = logging.getLogger(__name__)

EXTRACTIVE_MODEL = "extractive"

Vector = npt.NDArray[np.float32]

Status = Literal["ok", "extractive", "upstream_error", "error"]


class AnswerModel(QueryModel, Protocol):
    """The embedding model one question is answered with (see `registry.ServingModel`)."""

    def count_tokens(self, text: str) -> int: ...


@dataclass(frozen=True)
class Question:
    """What to answer, and where to look; collection ids are resolved and tenant-checked."""

    text: str
    tenant_id: uuid.UUID
    collection_ids: Sequence[uuid.UUID]
    options: SearchOptions
    rerank: bool | None = None
    fallback_extractive: bool = False
    history: Sequence[ChatMessage] = ()
    endpoint: str = "query"
    max_tokens: int | None = None
    temperature: float | None = None
    use_cache: bool = True
    refresh_cache: bool = False
    filters_key: str = ""  # the caller's filters, canonical JSON: part of the cache scope


@dataclass
class Answer:
    query_id: uuid.UUID
    text: str
    citations: list[Source]  # the sources the answer cites
    sources: list[Source]
    model: str
    status: Status
    timings_ms: dict[str, float]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    cache: CacheInfo | None = None


@dataclass
class _Prepared:
    """Retrieval's result: the hits in context order and the assembled context."""

    hits: list[SearchHit]
    context: Context
    model: AnswerModel
    timings: dict[str, float] = field(default_factory=dict)
    vector: Vector | None = None
    cache: CacheInfo | None = None
    # The sources block's tag, fresh for each question (see `safety.sources`).
    tag: str = field(default_factory=new_tag)


@dataclass
class _Generated:
    text: str
    model: str
    status: Status
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None


class AnswerPipeline:
    def __init__(
        self,
        *,
        db: Database,
        searcher: Searcher,
        models: Callable[[], AnswerModel],
        settings: Settings,
        reranker: Reranker | None = None,
        inference: InferenceClient | None = None,
        metrics: Metrics | None = None,
        cache: PromptCache | None = None,
    ) -> None:
        """`models` gives the embedding model to serve; each question calls it once and keeps
        that model throughout (cache scope, lookup, search, store)."""
        self._db = db
        self._cache = cache
        self._models = models
        self._searcher = searcher
        self._settings = settings
        self._reranker = reranker
        self._inference = inference
        self._metrics = metrics
        # Links to other hosts and active HTML are taken out of every answer (`safety`).
        self._text = AnswerText(settings.link_hosts(), settings.answer_html)

    def close(self) -> None:
        if self._cache is not None:
            self._cache.close()

    @property
    def model_name(self) -> str:
        return self._settings.inference_model if self._inference else EXTRACTIVE_MODEL

    async def answer(self, question: Question) -> Answer:
        started = time.perf_counter()
        model = self._models()
        lookup = await anyio.to_thread.run_sync(self._lookup, question, model)
        if lookup.response is not None:
            return await self._replay(question, lookup, model, started)
        prepared = await anyio.to_thread.run_sync(self._prepare, question, lookup, model)
        with timed(prepared.timings, "generate"):
            generated = await self._generate(question, prepared)
        generated.text = self._text.clean(generated.text)
        return await self._finish(question, prepared, generated, started)

    async def stream(self, question: Question) -> AsyncGenerator[str | Answer, None]:
        """Content pieces as they are generated, then the finished `Answer` last."""
        started = time.perf_counter()
        model = self._models()
        lookup = await anyio.to_thread.run_sync(self._lookup, question, model)
        if lookup.response is not None:
            replayed = await self._replay(question, lookup, model, started)
            for piece in _pieces(replayed.text):
                yield piece
            yield replayed
            return
        prepared = await anyio.to_thread.run_sync(self._prepare, question, lookup, model)
        with timed(prepared.timings, "generate"):
            pieces: list[str] = []
            shown = self._text.stream()  # cleaned as the text streams out
            if self._inference is None:
                generated = _extractive(prepared.context)
                generated.text = self._text.clean(generated.text)
                yield generated.text
            else:
                generated = _Generated(text="", model=self.model_name, status="ok")
                max_tokens, temperature = self._sampling(question)
                stream = self._inference.stream(
                    self._messages(question, prepared),
                    max_tokens=max_tokens,
                    temperature=temperature,
                )
                try:
                    async with aclosing(stream):
                        async for piece in stream:
                            pieces.append(piece)
                            if text := shown.feed(piece):
                                yield text
                        if text := shown.finish():
                            yield text
                except UpstreamError as exc:
                    generated = self._upstream_failed(question, prepared, exc, started=bool(pieces))
                    if generated.status == "extractive":
                        generated.text = self._text.clean(generated.text)
                        yield generated.text
                else:
                    generated = _streamed(pieces, stream.completion, self.model_name)
                    generated.text = self._text.clean(generated.text)
        yield await self._finish(question, prepared, generated, started)

    # -- the cache -------------------------------------------------------------------------------

    def _caches(self, question: Question) -> bool:
        # A conversation's earlier turns shape its answer: only single questions are cached.
        return self._cache is not None and question.use_cache and not question.history

    def _lookup(self, question: Question, model: AnswerModel) -> Lookup:
        if not self._caches(question) or question.refresh_cache:
            return Lookup(info=CacheInfo(hit=False)) if self._caches(question) else Lookup(None)
        assert self._cache is not None
        with tracing.span("cache_lookup"):
            return self._cache.lookup(
                self._scope(question, model),
                question.text,
                lambda: _embed_traced(model, question.text),
                model_id=model.id,
                dimension=model.dimension,
            )

    def _scope(self, question: Question, model: QueryModel) -> str:
        """The cache scope; it holds the embedding model, so entries of another model never
        match after a switch, and the ef_search its storage searches with."""
        max_tokens, temperature = self._sampling(question)
        settings = self._settings
        return scope_fingerprint(
            {
                "tenant": question.tenant_id,
                "collections": sorted(str(c) for c in question.collection_ids),
                "filters": question.filters_key,
                "mode": str(question.options.mode),
                "k": question.options.k,
                "retrieval": [
                    question.options.ef_search_for(model.storage),
                    settings.search_rrf_k,
                    settings.search_dense_candidates,
                    settings.search_text_candidates,
                    settings.bm25_k1,
                    settings.bm25_b,
                    settings.bm25_exact,
                    settings.bm25_postings_per_term,
                    settings.search_fusion,
                    settings.search_text_weight,
                    settings.search_adaptive_weight,
                    settings.search_prf,
                    settings.search_prf_docs,
                    settings.search_prf_terms,
                    settings.search_prf_query_weight,
                ],
                "embedding_model": model.id,
                "rerank": self._reranker.name
                if self._reranks(question) and self._reranker
                else None,
                "rerank_candidates": settings.rerank_candidates,
                "context": [settings.context_max_tokens, settings.context_neighbours],
                "model": self.model_name,
                "prompt": settings.system_prompt or "",
                "sampling": [max_tokens, temperature],
            }
        )

    def _cacheable(self, question: Question, prepared: _Prepared, generated: _Generated) -> bool:
        """An answer from a source flagged as instruction-like is never cached: an injection
        that worked would otherwise be replayed to the whole tenant."""
        flagged = any(source.flagged for source in prepared.context.sources)
        return (
            self._caches(question)
            and generated.error is None
            and bool(generated.text)
            and not flagged
            and prepared.vector is not None
        )

    def _remember(
        self,
        session: Session,
        question: Question,
        prepared: _Prepared,
        generated: _Generated,
        citations: list[Source],
    ) -> None:
        assert self._cache is not None and prepared.vector is not None
        used = {source.document_id for source in prepared.context.sources}
        versions = {
            h.document_id: h.document_version for h in prepared.hits if h.document_id in used
        }
        self._cache.put(
            session,
            tenant_id=question.tenant_id,
            scope=self._scope(question, prepared.model),
            collection_ids=question.collection_ids,
            prompt=question.text,
            vector=prepared.vector,
            model_id=prepared.model.id,
            response={
                "answer": generated.text,
                "model": generated.model,
                "status": generated.status,
                "cited": [source.number for source in citations],
                "sources": [source_to_json(source) for source in prepared.context.sources],
            },
            sources=versions,
            replace=question.refresh_cache,
        )

    async def _replay(
        self, question: Question, lookup: Lookup, model: AnswerModel, started: float
    ) -> Answer:
        """The answer from a cache entry, logged like any other (with what the cache did)."""
        response = lookup.response or {}
        sources = [source_from_json(item) for item in response.get("sources", [])]
        generated = _Generated(
            # Cleaned again: the allowed hosts or the HTML setting may have changed since the
            # answer was stored (and entries from before the HTML setting were stored raw).
            text=self._text.clean(str(response.get("answer", ""))),
            model=str(response.get("model", self.model_name)),
            status=response.get("status", "ok"),
        )
        prepared = _Prepared(
            hits=[],
            context=Context(sources=sources, text="", token_count=0, dropped=0),
            model=model,
            timings=_lookup_timings(lookup),
            cache=lookup.info,
        )
        return await self._finish(question, prepared, generated, started, remember=False)

    # -- retrieval -------------------------------------------------------------------------------

    def _prepare(self, question: Question, lookup: Lookup, model: AnswerModel) -> _Prepared:
        timings = _lookup_timings(lookup)
        vector = lookup.vector
        if vector is None and self._caches(question):
            with timed(timings, "embed"):
                vector = model.embed_query(question.text)
        hits = self._retrieve(question, timings, vector, model)
        if self._reranks(question) and hits:
            assert self._reranker is not None
            with timed(timings, "rerank"):
                hits = rerank_hits(self._reranker, question.text, hits, question.options.k)
        with timed(timings, "context"):
            neighbours = self._searcher.neighbours(hits, self._settings.context_neighbours)
            context = assemble_context(
                hits,
                count_tokens=model.count_tokens,
                budget_tokens=self._settings.context_max_tokens,
                neighbours=neighbours,
            )
        return _Prepared(
            hits=hits,
            context=context,
            model=model,
            timings=timings,
            vector=vector,
            cache=lookup.info,
        )

    def _retrieve(
        self,
        question: Question,
        timings: dict[str, float],
        vector: Vector | None,
        model: AnswerModel,
    ) -> list[SearchHit]:
        options = question.options
        if self._reranks(question):
            wanted = max(options.k, self._settings.rerank_candidates)
            options = replace(options, k=wanted)
        result = self._searcher.search(
            collection_ids=question.collection_ids,
            query=question.text,
            options=options,
            vector=vector,
            model=model,
        )
        embed = result.timings_ms.get("embed", 0.0)
        add_ms(timings, "embed", embed)
        timings["search"] = max(result.timings_ms.get("total", 0.0) - embed, 0.0)
        return result.hits

    def _reranks(self, question: Question) -> bool:
        return self._reranker is not None and question.rerank is not False

    # -- generation ------------------------------------------------------------------------------

    async def _generate(self, question: Question, prepared: _Prepared) -> _Generated:
        if self._inference is None:
            return _extractive(prepared.context)
        max_tokens, temperature = self._sampling(question)
        try:
            completion = await self._inference.complete(
                self._messages(question, prepared), max_tokens=max_tokens, temperature=temperature
            )
        except UpstreamError as exc:
            return self._upstream_failed(question, prepared, exc, started=False)
        return _Generated(
            text=completion.text,
            model=completion.model or self.model_name,
            status="ok",
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
        )

    def _upstream_failed(
        self, question: Question, prepared: _Prepared, exc: UpstreamError, *, started: bool
    ) -> _Generated:
        """Count the failure; answer extractively when the caller asked for that, else raise."""
        if self._metrics is not None:
            kind = "timeout" if isinstance(exc, UpstreamTimeoutError) else "error"
            self._metrics.upstream_errors.labels(kind=kind).inc()
        if question.fallback_extractive and not started:
            fallback = _extractive(prepared.context)
            fallback.error = str(exc)
            return fallback
        raise exc

    def _messages(self, question: Question, prepared: _Prepared) -> list[ChatMessage]:
        return build_messages(
            question.text,
            prepared.context.text,
            system_prompt=self._settings.system_prompt,
            history=question.history,
            tag=prepared.tag,
        )

    def _sampling(self, question: Question) -> tuple[int, float]:
        """max_tokens and temperature: the caller's, else the configured ones."""
        temperature = question.temperature
        if temperature is None:
            temperature = self._settings.inference_temperature
        return question.max_tokens or self._settings.inference_max_tokens, temperature

    # -- the answer ------------------------------------------------------------------------------

    async def _finish(
        self,
        question: Question,
        prepared: _Prepared,
        generated: _Generated,
        started: float,
        *,
        remember: bool = True,
    ) -> Answer:
        citations = _citations(generated, prepared.context)
        timings = {**prepared.timings, "total": ms_since(started)}
        messages = self._messages(question, prepared) if prepared.context.text else None
        record = _record(question, prepared, generated, citations, timings, messages)
        remember = remember and self._cacheable(question, prepared, generated)
        await anyio.to_thread.run_sync(
            self._keep, record, question, prepared, generated, citations, remember
        )
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
        question: Question,
        prepared: _Prepared,
        generated: _Generated,
        citations: list[Source],
        remember: bool,
    ) -> None:
        """Log the query and cache the answer on the primary, after the response is sent
        (`Database.write_later`): the caller never waits on either."""
        self._db.write_later(lambda session: self._log_query(session, record))
        if remember:
            self._db.write_later(
                lambda session: self._remember(session, question, prepared, generated, citations)
            )

    def _log_query(self, session: Session, record: store.query_log.QueryRecord) -> None:
        """Write the query log's row in a savepoint of its own; a failure is counted
        (`ragservice_query_log_write_failures_total`) and logged without the question."""
        try:
            with session.begin_nested():
                store.query_log.log_query(session, record)
        except Exception as exc:
            if self._metrics is not None:
                self._metrics.query_log_failures.inc()
            log.error("query log write of %s failed: %s", record.id, error_summary(exc))


def _embed_traced(model: AnswerModel, text: str) -> Vector:
    """The question's embedding for the cache lookup: an `embed` span of its own (the lookup
    times it itself)."""
    with tracing.span("embed"):
        return model.embed_query(text)


def _streamed(pieces: list[str], completion: Completion | None, model: str) -> _Generated:
    """A finished stream; usage as the upstream reported it, else one token per piece."""
    if completion is None:
        return _Generated(
            text="".join(pieces), model=model, status="ok", completion_tokens=len(pieces)
        )
    return _Generated(
        text="".join(pieces),
        model=completion.model or model,
        status="ok",
        prompt_tokens=completion.prompt_tokens,
        completion_tokens=completion.completion_tokens or len(pieces),
    )


def _lookup_timings(lookup: Lookup) -> dict[str, float]:
    if lookup.info is None:
        return {}
    timings = {"cache_lookup": lookup.elapsed_ms}
    if lookup.embed_ms:
        timings["embed"] = lookup.embed_ms
    return timings


def _pieces(text: str) -> list[str]:
    """A cached answer streamed in word-sized pieces, as a live one would arrive."""
    words = text.split(" ")
    return [word + (" " if i < len(words) - 1 else "") for i, word in enumerate(words)]


def _extractive(context: Context) -> _Generated:
    return _Generated(text=extract(context), model=EXTRACTIVE_MODEL, status="extractive")


def _citations(generated: _Generated, context: Context) -> list[Source]:
    """The sources the answer cites, in source order (an extractive answer cites what it shows)."""
    cited = set(citation_markers(generated.text))
    return [source for source in context.sources if source.number in cited]


def _record(
    question: Question,
    prepared: _Prepared,
    generated: _Generated,
    citations: list[Source],
    timings: dict[str, float],
    messages: Sequence[ChatMessage] | None,
) -> store.query_log.QueryRecord:
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
            "embedding_model": prepared.model.id,
        },
        retrieved=[
            store.query_log.RetrievedChunk(h.chunk_id, h.document_id, h.score)
            for h in prepared.hits
        ],
        answer=generated.text,
        citations=[
            store.query_log.Citation(c.number, c.document_id, tuple(c.chunk_ids)) for c in citations
        ],
        timings=timings,
        upstream_model=None if generated.model == EXTRACTIVE_MODEL else generated.model,
        status=generated.status,
        error=generated.error,
        cache=None if prepared.cache is None else prepared.cache.to_dict(),
        messages=None if messages is None else [m.to_dict() for m in messages],
        source_document_ids=[source.document_id for source in prepared.context.sources],
        request_id=logs.current_request_id(),
        trace_id=tracing.current_trace_id(),
    )
