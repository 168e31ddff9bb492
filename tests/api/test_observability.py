"""A question's trace (OpenTelemetry's in-memory exporter), its JSON log lines and its query
log row, tied together by the request id; and tracing off: no spans, no trace header."""

from __future__ import annotations

import io
import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from pydantic import SecretStr
from sqlalchemy import select

from ragservice.api.app import create_app
from ragservice.config import DEFAULT_TENANT_ID, Settings
from ragservice.db import tenancy
from ragservice.db.models import QueryLog
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from ragservice.observability import logs, tracing
from tests.api.conftest import ok
from tests.api.test_query import add_corpus
from tests.upstream import FakeOpenAI
from tests.upstream import ok as answer

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
STAGES = {"cache_lookup", "embed", "fulltext", "fuse", "rerank", "context", "generate"}


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """The JSON lines every logger writes during the test."""
    stream = io.StringIO()
    handler = logs.handler("json", stream)
    root = logging.getLogger()
    root.addHandler(handler)
    level = logging.getLogger("ragservice").level
    logging.getLogger("ragservice").setLevel(logging.INFO)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        logging.getLogger("ragservice").setLevel(level)


def make_client(
    settings: Settings,
    embedder: SentenceTransformerEmbedder,
    provider: TracerProvider,
    **update: Any,
) -> TestClient:
    from ingest.worker import JobWorker

    configured = settings.model_copy(update={"auth_disabled": True, "log_format": "json", **update})
    app = create_app(configured, embedder=embedder, services=[JobWorker], tracer_provider=provider)
    return TestClient(app, raise_server_exceptions=False)


def memory_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def logged(client: TestClient, query_id: str) -> QueryLog:
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.read() as session:
        row = session.scalar(select(QueryLog).where(QueryLog.id == uuid.UUID(query_id)))
        assert row is not None
        return row


def access_line(stream: io.StringIO, request_id: str) -> dict[str, Any]:
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    found = [
        line
        for line in lines
        if line["logger"] == logs.ACCESS_LOGGER and line.get("request_id") == request_id
    ]
    assert len(found) == 1, lines
    return found[0]


def test_a_question_is_one_trace_from_the_caller_to_the_upstream(
    settings: Settings,
    embedder: SentenceTransformerEmbedder,
    tiny_cross_encoder_path: Path,
    json_lines: io.StringIO,
) -> None:
    provider, exporter = memory_provider()
    with (
        FakeOpenAI() as fake,
        make_client(
            settings,
            embedder,
            provider,
            tracing=True,
            inference_url=fake.base_url,
            inference_model="upstream-model",
            inference_api_key=SecretStr("sk-upstream"),
            reranker=str(tiny_cross_encoder_path),
        ) as client,
    ):
        add_corpus(client, {})
        exporter.clear()
        fake.enqueue(answer("Parents get sixteen weeks [1]."))
        response = client.post(
            "/v1/query",
            json={"question": "How long is parental leave?", "k": 2},
            headers={
                "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
                "X-Request-ID": "req-traced-1",
            },
        )
        reply = ok(response)
        row = logged(client, reply["query_id"])
    # The job workers' polls are traces of their own (the server's sampler leaves them out).
    spans = [
        s for s in exporter.get_finished_spans() if s.context.trace_id == int(CALLER_TRACE, 16)
    ]

    # The request: a server span continuing the caller's trace, its id in the response.
    assert response.headers["x-trace-id"] == CALLER_TRACE
    assert response.headers["x-request-id"] == "req-traced-1"
    (root,) = [s for s in spans if s.kind is SpanKind.SERVER]
    assert root.name == "POST /v1/query"
    assert root.parent is not None and f"{root.parent.span_id:016x}" == CALLER_SPAN
    assert root.attributes is not None
    assert root.attributes["http.route"] == "/v1/query"
    assert root.attributes["http.response.status_code"] == 200
    assert root.attributes["ragservice.request_id"] == "req-traced-1"
    assert root.attributes["ragservice.tenant_id"] == DEFAULT_TENANT_ID

    # The pipeline's stages, children of the request; the deferred writes after the response.
    children = {s.name: s for s in spans if _parent(s) == root.context.span_id}
    assert STAGES | {"log_write"} <= set(children)

    # SQL spans, the query log's insert among the deferred writes.
    sql = [s for s in spans if _is_sql(s)]
    assert sql
    assert any(_parent(s) == children["log_write"].context.span_id for s in sql)

    # The upstream call: an httpx client span within `generate`, its traceparent sent along.
    (upstream,) = [s for s in spans if s.kind is SpanKind.CLIENT and not _is_sql(s)]
    assert _parent(upstream) == children["generate"].context.span_id
    sent = fake.chat_requests[-1].headers["traceparent"]
    assert sent == f"00-{CALLER_TRACE}-{upstream.context.span_id:016x}-01"

    # The query log and the JSON access line name the same request and trace.
    assert (row.request_id, row.trace_id) == ("req-traced-1", CALLER_TRACE)
    line = access_line(json_lines, "req-traced-1")
    assert line["trace_id"] == CALLER_TRACE
    assert line["route"] == "/v1/query"
    assert line["tenant"] == DEFAULT_TENANT_ID


def test_tracing_off_makes_no_spans_and_still_logs_the_request_id(
    settings: Settings, embedder: SentenceTransformerEmbedder, json_lines: io.StringIO
) -> None:
    provider, exporter = memory_provider()  # handed over, but RAGSERVICE_TRACING is off
    with make_client(settings, embedder, provider) as client:
        assert tracing.current() is None
        add_corpus(client, {})
        response = client.post(
            "/v1/query",
            json={"question": "How long is parental leave?"},
            headers={"X-Request-ID": "req-plain-1"},
        )
        reply = ok(response)
        row = logged(client, reply["query_id"])
    assert exporter.get_finished_spans() == ()
    assert "x-trace-id" not in response.headers
    assert (row.request_id, row.trace_id) == ("req-plain-1", None)

    line = access_line(json_lines, "req-plain-1")
    assert response.headers["x-request-id"] == line["request_id"] == row.request_id
    assert {
        "method": "POST",
        "route": "/v1/query",
        "status": 200,
        "tenant": DEFAULT_TENANT_ID,
        "level": "INFO",
    }.items() <= line.items()
    assert line["duration_ms"] > 0
    assert line["timestamp"].endswith("+00:00")
    assert "trace_id" not in line


def _parent(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def _is_sql(span: ReadableSpan) -> bool:
    attributes = span.attributes or {}
    return "postgresql" in (attributes.get("db.system"), attributes.get("db.system.name"))
