"""Bursts queue: embedding computations and inference calls never exceed their bounds."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest

from ragservice.answering.inference import InferenceClient, upstream_share
from ragservice.answering.prompt import ChatMessage
from ragservice.config import Settings
from ragservice.embedding import query_encoder
from ragservice.embedding.embedder import (
    SentenceTransformerEmbedder,
    Vector,
    Vectors,
)
from ragservice.errors import UpstreamTimeoutError

DIMENSION = 4


class InFlight:
    """Counts the calls running at once and keeps the highest count seen."""

    def __init__(self, seconds: float = 0.03) -> None:
        self.seconds = seconds
        self.now = 0
        self.peak = 0
        self.calls = 0
        self._lock = threading.Lock()

    @contextmanager
    def running(self) -> Iterator[None]:
        with self._lock:
            self.now += 1
            self.calls += 1
            self.peak = max(self.peak, self.now)
        try:
            yield
        finally:
            with self._lock:
                self.now -= 1

    def work(self) -> None:
        with self.running():
            time.sleep(self.seconds)


class FakeModel:
    """What `SentenceTransformerEmbedder` uses of a sentence-transformers model."""

    max_seq_length = 128

    def __init__(self, tracker: InFlight) -> None:
        self.tracker = tracker
        self.tokenizer = lambda texts, **_: {"length": [len(t.split()) + 2 for t in texts]}

    def __getitem__(self, index: int) -> object:
        return object()  # no transformer module: the lean query encoders refuse it

    def get_embedding_dimension(self) -> int:
        return DIMENSION

    def encode(self, texts: list[str], **_: Any) -> Vectors:
        self.tracker.work()
        return np.full((len(texts), DIMENSION), 0.5, dtype=np.float32)


class FakeTorchEncoder:
    def __init__(self, tracker: InFlight) -> None:
        self.tracker = tracker

    def encode(self, text: str) -> Vector:
        self.tracker.work()
        return np.full(DIMENSION, 0.5, dtype=np.float32)


def fake_embedder(
    tracker: InFlight, bound: int, monkeypatch: pytest.MonkeyPatch, *, torch_queries: bool = True
) -> Any:
    """An embedder that loads `FakeModel`; with `torch_queries`, queries go to a torch-style
    encoder (no model lock, as ONNX and torch queries run), else through the model's `encode`."""
    import sentence_transformers

    monkeypatch.setattr(
        sentence_transformers, "SentenceTransformer", lambda *_, **__: FakeModel(tracker)
    )
    embedder = SentenceTransformerEmbedder("fake", device="cpu", batch_size=2, max_concurrent=bound)
    if torch_queries:
        cuda = SimpleNamespace(device=SimpleNamespace(type="cuda"))  # auto: torch, not ONNX
        monkeypatch.setattr(query_encoder, "QueryPipeline", lambda model: cuda)
        monkeypatch.setattr(query_encoder, "TorchQueryEncoder", lambda _: FakeTorchEncoder(tracker))
    return embedder


@pytest.mark.parametrize("bound", [1, 3])
def test_a_burst_of_queries_runs_at_most_the_bound_at_once(
    bound: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracker = InFlight()
    embedder = fake_embedder(tracker, bound, monkeypatch)
    with ThreadPoolExecutor(max_workers=12) as pool:
        vectors = list(pool.map(embedder.embed_query, [f"query {i}" for i in range(36)]))
    assert embedder.query_backend == "torch"
    assert len(vectors) == tracker.calls == 36
    assert tracker.peak == bound  # never more, and the burst did fill the bound


def test_batches_and_queries_share_one_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    tracker = InFlight()
    embedder = fake_embedder(tracker, 2, monkeypatch)
    texts = [f"passage {i}" for i in range(8)]  # four model batches of two

    def work(i: int) -> int:
        if i % 4 == 0:
            return len(embedder.embed(texts))
        return len(embedder.embed_query(f"query {i}").reshape(1, -1))

    with ThreadPoolExecutor(max_workers=10) as pool:
        rows = list(pool.map(work, range(20)))
    assert rows == [8 if i % 4 == 0 else 1 for i in range(20)]
    assert tracker.peak == 2  # a batch in progress plus queries: still two at most


def test_queries_through_the_model_lock_do_not_deadlock_with_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracker = InFlight(seconds=0.005)
    # Queries via `encode`: model lock, then slot.
    embedder = fake_embedder(tracker, 1, monkeypatch, torch_queries=False)
    texts = [f"passage {i}" for i in range(6)]

    def work(i: int) -> int:
        return len(embedder.embed(texts) if i % 2 else embedder.embed_query("q").reshape(1, -1))

    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(work, i) for i in range(16)]
        rows = [future.result(timeout=30) for future in futures]
    assert embedder.query_backend == "encode"
    assert rows == [6 if i % 2 else 1 for i in range(16)]
    assert tracker.peak == 1


# -- the inference client ------------------------------------------------------------------------

MESSAGES = [ChatMessage(role="user", content="What is the capital of France?")]
SAMPLING: dict[str, Any] = {"max_tokens": 16, "temperature": 0.0}


def completion(text: str) -> dict[str, Any]:
    return {"model": "m", "choices": [{"message": {"content": text}, "finish_reason": "stop"}]}


def sse(*pieces: str) -> bytes:
    chunks = [{"choices": [{"delta": {"content": p}, "finish_reason": None}]} for p in pieces]
    events = [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]
    return "".join(events).encode()


class FakeUpstream:
    """An OpenAI-style upstream as an httpx transport, counting requests in progress."""

    def __init__(self, seconds: float = 0.05) -> None:
        self.seconds = seconds
        self.now = 0
        self.peak = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            await asyncio.sleep(self.seconds)
        finally:
            self.now -= 1
        if json.loads(request.content)["stream"]:
            return httpx.Response(
                200, content=sse("Par", "is"), headers={"content-type": "text/event-stream"}
            )
        return httpx.Response(200, json=completion("Paris"))


def client_on(upstream: FakeUpstream, **options: Any) -> InferenceClient:
    return InferenceClient(
        "http://upstream.test/v1",
        model="m",
        transport=httpx.MockTransport(upstream),
        **options,
    )


@pytest.mark.anyio
async def test_concurrent_completions_are_bounded_and_all_answered() -> None:
    upstream = FakeUpstream()
    async with client_on(upstream, max_concurrent=3) as client:
        answers = await asyncio.gather(*(client.complete(MESSAGES, **SAMPLING) for _ in range(12)))
    assert [a.text for a in answers] == ["Paris"] * 12
    assert upstream.peak == 3


@pytest.mark.anyio
async def test_a_stream_holds_its_slot_and_a_call_queued_past_its_deadline_is_504() -> None:
    upstream = FakeUpstream(seconds=0.0)
    async with client_on(upstream, max_concurrent=1, deadline_seconds=0.3) as client:
        stream = client.stream(MESSAGES, **SAMPLING)
        assert await anext(stream) == "Par"  # the stream is open: it holds the one slot
        started = time.monotonic()
        with pytest.raises(UpstreamTimeoutError, match="RAGSERVICE_MAX_CONCURRENT_UPSTREAM"):
            await client.complete(MESSAGES, **SAMPLING)
        assert 0.25 < time.monotonic() - started < 2
        await stream.aclose()  # frees the slot
        answer = await client.complete(MESSAGES, **SAMPLING)
    assert answer.text == "Paris"


@pytest.mark.parametrize(
    ("slots", "share", "expected"), [(16, None, 15), (1, None, 1), (4, 2, 2), (4, 9, 4)]
)
def test_one_tenant_holds_all_upstream_slots_but_one_unless_configured(
    slots: int, share: int | None, expected: int
) -> None:
    settings = Settings(max_concurrent_upstream=slots, max_concurrent_upstream_per_tenant=share)
    assert upstream_share(settings.limits) == expected
    client = InferenceClient.from_settings(
        settings.model_copy(update={"inference_url": "http://localhost:1/v1"})
    )
    assert client is not None and client.slots.per_owner == expected
