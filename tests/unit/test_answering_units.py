"""The answering sequence's units, each alone: how text is generated and what an upstream
failure does (`generation`), the cache policy (`answer_cache`), the query log's record
(`query_record`) and the typed entry that crosses to the cache (`prompt_cache.CachedAnswer`)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from ragservice.answering.answer_cache import AnswerCache
from ragservice.answering.context import Context, Source
from ragservice.answering.generation import (
    EXTRACTIVE_MODEL,
    Completed,
    Fallback,
    Generated,
    Generation,
    Streamed,
    UpstreamPolicy,
    word_pieces,
)
from ragservice.answering.inference import Completion
from ragservice.answering.prompt import ChatMessage
from ragservice.answering.query_record import Answered, QueryLog, query_record
from ragservice.answering.question import Question, QuestionVector
from ragservice.cache.prompt_cache import CachedAnswer, CacheInfo
from ragservice.errors import UpstreamError, UpstreamTimeoutError
from ragservice.retrieval.search import SearchOptions

SOURCE = Source(
    number=1,
    document_id=uuid.UUID(int=7),
    external_id="leave",
    title="Leave",
    chunk_ids=(uuid.UUID(int=8),),
    start_char=0,
    end_char=40,
    text="Parents get sixteen weeks of paid leave.",
    score=0.9,
)
CONTEXT = Context(sources=[SOURCE], text="[1] Parents get sixteen weeks.", token_count=9, dropped=0)
QUESTION = Question(
    text="How long is leave?",
    tenant_id=uuid.UUID(int=1),
    collection_ids=(),
    options=SearchOptions(),
)


def pieces_of(generation: Generation) -> list[str]:
    async def collect() -> list[str]:
        return [piece async for piece in generation.pieces()]

    return asyncio.run(collect())


class Upstream:
    """An inference client that answers, streams, or fails as told."""

    def __init__(self, pieces: list[str], fail_after: int | None = None) -> None:
        self._pieces = pieces
        self._fail_after = fail_after

    async def complete(self, messages: list[ChatMessage], **_: Any) -> Completion:
        if self._fail_after is not None:
            raise UpstreamTimeoutError("upstream timed out")
        return Completion(text="".join(self._pieces), model="m1", prompt_tokens=3)

    def stream(self, messages: list[ChatMessage], **_: Any) -> _Stream:
        return _Stream(self._pieces, self._fail_after)


class _Stream:
    completion: Completion | None = None

    def __init__(self, pieces: list[str], fail_after: int | None) -> None:
        self._pieces = pieces
        self._fail_after = fail_after

    def __aiter__(self) -> AsyncIterator[str]:
        return self._deltas()

    async def _deltas(self) -> AsyncIterator[str]:
        for number, piece in enumerate(self._pieces):
            if number == self._fail_after:
                raise UpstreamError("upstream went away")
            yield piece
        if self._fail_after == len(self._pieces):
            raise UpstreamError("upstream went away")

    async def aclose(self) -> None:
        pass


def live(kind: type[Completed], upstream: Upstream, *, fallback: bool) -> Completed:
    return kind(
        upstream,  # type: ignore[arg-type]
        [],
        sampling=(64, 0.0),
        model="configured",
        on_failure=Fallback(UpstreamPolicy(), CONTEXT, fallback=fallback),
    )


def test_a_finished_text_is_given_whole_or_in_word_sized_pieces() -> None:
    generated = Generated(text="a b c", model="m", status="ok")
    assert Generation(generated).split("a b c") == ["a b c"]
    assert Generation(generated, word_sized=True).split("a b c") == ["a ", "b ", "c"]
    assert "".join(word_pieces("one  two")) == "one  two"
    assert not Generation(generated).live


def test_a_completion_is_one_piece_with_the_upstream_usage() -> None:
    generation = live(Completed, Upstream(["Sixteen ", "weeks."]), fallback=False)
    assert generation.live
    assert pieces_of(generation) == ["Sixteen weeks."]
    assert generation.result.model == "m1"
    assert generation.result.prompt_tokens == 3


def test_a_stream_gives_its_pieces_and_counts_them_without_usage() -> None:
    generation = live(Streamed, Upstream(["Sixteen ", "weeks."]), fallback=False)
    assert pieces_of(generation) == ["Sixteen ", "weeks."]
    assert generation.result.text == "Sixteen weeks."
    assert generation.result.completion_tokens == 2


@pytest.mark.parametrize("kind", [Completed, Streamed])
def test_an_upstream_failure_before_any_piece_falls_back_when_asked(kind: type[Completed]) -> None:
    generation = live(kind, Upstream(["x"], fail_after=0), fallback=True)
    assert pieces_of(generation) == [generation.result.text]
    assert generation.result.status == "extractive"
    assert generation.result.model == EXTRACTIVE_MODEL
    assert generation.result.error


@pytest.mark.parametrize("kind", [Completed, Streamed])
def test_an_upstream_failure_is_raised_without_a_fallback(kind: type[Completed]) -> None:
    with pytest.raises(UpstreamError):
        pieces_of(live(kind, Upstream(["x"], fail_after=0), fallback=False))


def test_a_failure_after_the_first_piece_is_raised_even_with_a_fallback() -> None:
    with pytest.raises(UpstreamError):
        pieces_of(live(Streamed, Upstream(["a", "b"], fail_after=1), fallback=True))


def test_upstream_failures_are_counted_by_kind() -> None:
    counted: list[str] = []

    class Counter:
        def labels(self, *, kind: str) -> Counter:
            counted.append(kind)
            return self

        def inc(self) -> None:
            pass

    class Metrics:
        upstream_errors = Counter()

    policy = UpstreamPolicy(Metrics())  # type: ignore[arg-type]
    policy.failed(UpstreamTimeoutError("t"), CONTEXT, fallback=True, started=False)
    with pytest.raises(UpstreamError):
        policy.failed(UpstreamError("e"), CONTEXT, fallback=False, started=False)
    assert counted == ["timeout", "error"]


class _Cache:
    def close(self) -> None:
        pass


def test_the_cache_serves_single_questions_only_and_never_flagged_sources() -> None:
    policy = AnswerCache(_Cache())  # type: ignore[arg-type]
    ok = Generated(text="Sixteen weeks [1].", model="m", status="ok")
    assert policy.caches(QUESTION)
    assert not policy.caches(question_with(use_cache=False))
    assert not policy.caches(question_with(history=(ChatMessage("user", "hi"),)))
    assert not AnswerCache(None).caches(QUESTION)
    assert policy.cacheable(QUESTION, [SOURCE], ok)
    flagged = replace(SOURCE, flagged=True)
    assert not policy.cacheable(QUESTION, [flagged], ok)
    assert not policy.cacheable(QUESTION, [SOURCE], Generated(text="", model="m", status="ok"))
    failed = Generated(text="x", model="m", status="extractive", error="upstream timed out")
    assert not policy.cacheable(QUESTION, [SOURCE], failed)


def question_with(**changes: Any) -> Question:
    from dataclasses import replace

    return replace(QUESTION, **changes)


def test_a_refresh_is_a_miss_and_an_uncached_question_is_not_looked_up() -> None:
    policy = AnswerCache(_Cache())  # type: ignore[arg-type]
    vector = QuestionVector(_Model(), "q")
    refresh = policy.lookup(question_with(refresh_cache=True), _Model(), vector, "s")
    assert refresh.info == CacheInfo(hit=False) and refresh.answer is None
    assert policy.lookup(question_with(use_cache=False), _Model(), vector, "s").info is None
    assert vector.computed is None  # nothing embedded for either


def test_the_question_is_embedded_once() -> None:
    model = _Model()
    vector = QuestionVector(model, "q")
    assert vector.computed is None
    first = vector.get()
    assert vector.get() is first and vector.computed is first
    assert model.calls == 1


def test_a_cached_answer_round_trips_and_old_entries_read_their_defaults() -> None:
    cached = CachedAnswer(
        answer="Sixteen weeks [1].",
        model="m",
        status="ok",
        cited=(1,),
        sources=(SOURCE,),
        question="How long is leave?",
    )
    assert CachedAnswer.from_json(cached.to_json()) == cached
    old = CachedAnswer.from_json({"answer": "a", "model": "m", "sources": []})
    assert old.status == "ok" and old.cited == () and old.question == ""


def test_the_query_record_names_what_the_answer_was_built_from() -> None:
    generated = Generated(text="Sixteen weeks [1].", model=EXTRACTIVE_MODEL, status="extractive")
    answered = Answered(
        question=QUESTION,
        model_id=3,
        hits=[],
        sources=[SOURCE],
        generated=generated,
        citations=[SOURCE],
        timings={"total": 1.0},
        messages=None,
        cache=CacheInfo(hit=False),
    )
    record = query_record(answered)
    assert record.params["embedding_model"] == 3
    assert record.upstream_model is None  # an extractive answer had no upstream
    assert record.source_document_ids == [SOURCE.document_id]
    assert record.citations[0].document_id == SOURCE.document_id
    assert record.cache == CacheInfo(hit=False).to_dict()


def test_a_failed_query_log_write_is_counted_and_never_raised() -> None:
    counted: list[int] = []

    class Failures:
        def inc(self) -> None:
            counted.append(1)

    class Metrics:
        query_log_failures = Failures()

    class Session:
        def begin_nested(self) -> Any:
            raise RuntimeError("the database went away")

    record = query_record(
        Answered(
            question=QUESTION,
            model_id=1,
            hits=[],
            sources=[],
            generated=Generated(text="", model="m", status="ok"),
            citations=[],
            timings={},
            messages=None,
            cache=None,
        )
    )
    QueryLog(Metrics()).write(Session(), record)  # type: ignore[arg-type]
    assert counted == [1]


class _Model:
    id = 1
    dimension = 4
    storage = "float32"

    def __init__(self) -> None:
        self.calls = 0

    def embed_query(self, text: str) -> Any:
        import numpy as np

        self.calls += 1
        return np.ones(4, dtype=np.float32)
