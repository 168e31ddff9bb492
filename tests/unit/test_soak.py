"""The pure parts of `benchmarks/soak.py`: the traffic mix, percentiles, server-sent events, and
which responses count as errors (429s are deliberate, not errors)."""

from __future__ import annotations

import argparse
import collections
import importlib.util
import random
import sys
import time
from types import ModuleType
from typing import Any

import httpx
import pytest

from tests.unit.test_layering import ROOT


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soak", ROOT / "benchmarks" / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


soak = _load()


def test_the_default_mix_and_a_partial_one() -> None:
    assert soak.parse_mix(soak.DEFAULT_MIX) == {
        "search": 60.0,
        "ask": 20.0,
        "feedback": 10.0,
        "ingest": 10.0,
    }
    assert soak.parse_mix(" search = 3 , ingest=1,") == {
        "search": 3.0,
        "ask": 0.0,
        "feedback": 0.0,
        "ingest": 1.0,
    }


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("search=60,chat=10", "NAME=WEIGHT"),
        ("search", "NAME=WEIGHT"),
        ("search=lots", "not a number"),
        ("search=-1,ask=2", "negative"),
        ("search=0", "weighs nothing"),
    ],
)
def test_a_bad_mix_is_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        soak.parse_mix(text)


def test_draws_follow_the_weights_and_never_pick_a_zero_weight() -> None:
    rng = random.Random(7)
    weights = soak.parse_mix("search=60,ask=30,ingest=10")
    counts = collections.Counter(soak.draw(weights, rng) for _ in range(20_000))
    assert counts["feedback"] == 0
    assert counts["search"] / 20_000 == pytest.approx(0.6, abs=0.02)
    assert counts["ask"] / 20_000 == pytest.approx(0.3, abs=0.02)
    assert counts["ingest"] / 20_000 == pytest.approx(0.1, abs=0.02)


def test_latency_percentiles_by_nearest_rank() -> None:
    values = [float(v) for v in range(100, 0, -1)]  # 1 … 100, unordered
    assert soak.latency_summary(values) == {"p50_ms": 51.0, "p95_ms": 95.0, "p99_ms": 99.0}
    assert soak.latency_summary([]) == {"p50_ms": None, "p95_ms": None, "p99_ms": None}


def test_server_sent_events_as_the_service_writes_them() -> None:
    lines = [
        "event: token",
        'data: {"text": "Sixteen"}',
        "",
        "event: done",
        'data: {"query_id": "q1"}',
        "",
        "event: error",
        'data: {"error": "Upstream"}',
    ]
    assert list(soak.parse_sse(lines)) == [
        ("token", {"text": "Sixteen"}),
        ("done", {"query_id": "q1"}),
        ("error", {"error": "Upstream"}),
    ]


def test_feedback_never_judges_a_chunk_both_ways() -> None:
    answer = soak.Answered("q1", [["a", "b"], ["c"], ["a"]])
    rng = random.Random(3)
    bodies = [soak.feedback_body(answer, rng) for _ in range(200)]
    judged = [b for b in bodies if "relevant_chunk_ids" in b]
    assert 50 < len(judged) < 150
    for body in bodies:
        assert body["query_id"] == "q1"
        assert body["rating"] in ((1, -1) if "scale" not in body else range(1, 6))
        assert not set(body.get("relevant_chunk_ids", [])) & set(
            body.get("irrelevant_chunk_ids", [])
        )


def _client(handler: Any) -> Any:
    args = argparse.Namespace(
        seed=0, collection="c", no_cache=False, ingest_docs=2, job_timeout=60, poll_seconds=0
    )
    recorder = soak.Recorder(5)
    shared = soak.Shared(args, soak.parse_mix("search=1"), ["q"], "s", recorder, time.monotonic())
    http = httpx.Client(base_url="http://soak.test", transport=httpx.MockTransport(handler))
    return soak.Client(shared, http, 0)


def test_a_429_is_deliberate_while_a_500_and_an_exception_are_errors() -> None:
    replies = iter([httpx.Response(429, headers={"Retry-After": "1"}), httpx.Response(500)])

    def handler(request: httpx.Request) -> httpx.Response:
        reply = next(replies, None)
        if reply is None:
            raise httpx.ConnectError("refused", request=request)
        return reply if reply.status_code != 500 else httpx.Response(500, text="boom")

    client = _client(handler)
    for _ in range(3):
        client.search()
    totals = client.shared.recorder.totals()
    assert totals == (3, 2, 1)  # requests, errors, 429s
    routes = client.shared.recorder.summary().values()  # search/<a mode drawn at random>
    errors = sum((collections.Counter(r["errors"]) for r in routes), collections.Counter())
    assert errors == {"500": 1, "exception:ConnectError": 1}
    assert all(r["p50_ms"] is None for r in routes)
    assert any("boom" in line for line in client.shared.recorder.samples)


def test_a_stream_ending_with_an_error_event_is_an_error() -> None:
    events = 'event: token\ndata: {"text": "x"}\n\nevent: error\ndata: {"error": "Upstream"}\n\n'

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=events, headers={"content-type": "text/event-stream"})

    client = _client(handler)
    assert client._streamed({"question": "q", "stream": True}) is None
    assert client.shared.recorder.summary()["query/stream"]["errors"] == {"stream-error": 1}


def test_an_upload_is_judged_by_its_job_polled_between_other_operations() -> None:
    states = iter(["queued", "running", "done"])

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            assert request.url.path == "/v1/collections/s/documents"
            return httpx.Response(202, json={"id": "j1"})
        assert request.url.path == "/v1/jobs/j1"
        status = next(states)
        errors = [{"source": "x", "error": "bad"}] if status == "done" else []
        return httpx.Response(200, json={"status": status, "errors": errors})

    client = _client(handler)
    client.ingest()
    assert client.job is not None and client.job.id == "j1"
    client._poll_job()  # queued
    client._poll_job()  # running
    assert client.job is not None
    client._poll_job()  # done, with a per-document error
    assert client.job is None
    summary = client.shared.recorder.summary()
    assert summary["ingest/job"]["errors"] == {"job-errors": 1}
    assert summary["ingest/poll"]["count"] == 3
    assert summary["ingest/upload"]["count"] == 1


def test_no_second_upload_is_drawn_while_the_clients_job_runs() -> None:
    client = _client(lambda request: httpx.Response(200))
    client.shared.weights = soak.parse_mix("search=1,ingest=9")
    assert "ingest" in {client._next_operation() for _ in range(50)}
    client.job = soak.Job("j1", 0.0, time.monotonic() + 60, time.monotonic() + 60)
    assert {client._next_operation() for _ in range(200)} == {"search"}
