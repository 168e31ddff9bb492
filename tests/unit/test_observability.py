"""Log lines (text, JSON with the request's fields) and the tracing set-up from OTEL_*."""

from __future__ import annotations

import contextvars
import io
import json
import logging
import threading
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from ragservice import extras, timing
from ragservice.config import Settings
from ragservice.errors import ConfigurationError
from ragservice.observability import logs, tracing


def written(log_format: logs.LogFormat, emit: object) -> str:
    stream = io.StringIO()
    logger = logging.getLogger("ragservice.test_observability")
    handler = logs.handler(log_format, stream)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        assert callable(emit)
        emit(logger)
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def test_json_lines_carry_the_request_also_from_a_worker_thread() -> None:
    scope = {"route": SimpleNamespace(path="/v1/collections/{name}")}
    info = logs.RequestInfo("req-1", scope)

    def emit(logger: logging.Logger) -> None:
        with logs.request_context(info):
            logs.set_request_tenant("t-1")
            # As anyio.to_thread and the searcher's pool run work: in a copy of the context.
            worker = threading.Thread(
                target=contextvars.copy_context().run, args=(logger.warning, "from %s", "a thread")
            )
            worker.start()
            worker.join()
        logger.info("after the request")

    first, second = (json.loads(line) for line in written("json", emit).splitlines())
    assert {
        "level": "WARNING",
        "logger": "ragservice.test_observability",
        "message": "from a thread",
        "request_id": "req-1",
        "tenant": "t-1",
        "route": "/v1/collections/{name}",
    }.items() <= first.items()
    assert first["timestamp"].endswith("+00:00")  # ISO 8601 in UTC
    assert "request_id" not in second and "trace_id" not in second


def test_text_lines_keep_their_format() -> None:
    assert written("text", lambda logger: logger.info("hello")) == (
        "INFO ragservice.test_observability: hello\n"
    )


def test_exporters_follow_otel_traces_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console, none")
    (console,) = tracing.exporters_from_environment()
    assert isinstance(console, ConsoleSpanExporter)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(ConfigurationError, match="no trace exporter named 'zipkin'"):
        tracing.exporters_from_environment()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    with pytest.raises(ConfigurationError, match="http/protobuf"):
        tracing.exporters_from_environment()


def test_the_provider_names_the_service_and_records_only_what_requests_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    provider = tracing.provider_from_environment()
    assert provider.resource.attributes["service.name"] == "ragservice"
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("job poll"):  # work no request started
        pass
    with (
        tracer.start_as_current_span("GET /healthz", kind=SpanKind.SERVER),
        tracer.start_as_current_span("SELECT", kind=SpanKind.CLIENT),
    ):
        pass
    assert [s.name for s in exporter.get_finished_spans()] == ["SELECT", "GET /healthz"]
    provider.shutdown()

    monkeypatch.setenv("OTEL_SERVICE_NAME", "rag-eu")
    named = tracing.provider_from_environment()
    assert named.resource.attributes["service.name"] == "rag-eu"
    named.shutdown()


def test_timed_stages_are_spans_while_tracing_is_on_only() -> None:
    settings = Settings()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    timings: dict[str, float] = {}
    on = settings.model_copy(update={"tracing": True})
    with tracing.activated(on.observability, provider=provider), timing.timed(timings, "embed"):
        pass
    with timing.timed(timings, "embed"):
        pass
    assert [s.name for s in exporter.get_finished_spans()] == ["embed"]
    assert tracing.current() is None and timing._stage_span is None
    with tracing.activated(settings.observability, provider=provider) as off:
        assert off is None and tracing.current() is None


def test_tracing_without_the_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings()
    monkeypatch.setattr(extras, "find_spec", lambda name: None)
    with pytest.raises(ConfigurationError, match=r"pip install 'ragservice\[otel\]'"):
        tracing.check_available(settings.model_copy(update={"tracing": True}).observability)
    tracing.check_available(settings.observability)  # off: nothing to check
