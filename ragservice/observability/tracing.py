"""OpenTelemetry tracing: optional (the `otel` extra) and off by default (`RAGSERVICE_TRACING`).

On, a server holds one `Tracing` for its lifetime (`activated`): an SDK tracer provider whose
exporter, sampler and resource come from the standard `OTEL_*` variables, read by the SDK
itself (`OTEL_TRACES_EXPORTER` otlp | console | none, `OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_TRACES_SAMPLER`, `OTEL_SERVICE_NAME`, default "ragservice", …). Each request is a
server span (`request`), each timed stage of the pipeline a child span (`timing.timed`), the
SQL of the service's engines and the upstream's httpx calls spans of their own, and the
W3C `traceparent` goes out to the upstream.

Off, nothing of OpenTelemetry is imported: `current()` is None, `span()` a null context and
`timing.timed` opens no span. The provider is the service's own, never the global one (which
OpenTelemetry lets a process set only once), so tests and benchmarks pass theirs in.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from ragservice import timing
from ragservice.config import ObservabilitySettings
from ragservice.errors import ConfigurationError
from ragservice.extras import missing_extra

if TYPE_CHECKING:
    import httpx
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.sampling import Sampler
    from opentelemetry.trace import Span

TRACE_ID_HEADER = "x-trace-id"
DEFAULT_SERVICE_NAME = "ragservice"

_current: Tracing | None = None


def current() -> Tracing | None:
    """The process's tracing while it is on, else None."""
    return _current


def span(name: str) -> AbstractContextManager[object]:
    """A span named `name` around a block while tracing is on; nothing otherwise."""
    tracing = _current
    return nullcontext() if tracing is None else tracing.stage(name)


def current_trace_id() -> str | None:
    """The trace id (32 hex digits) of the span in progress, when tracing is on."""
    ids = current_ids()
    return None if ids is None else ids[0]


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the span in progress, as hex, when tracing is on and one is."""
    if _current is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return trace.format_trace_id(context.trace_id), trace.format_span_id(context.span_id)


class RequestSpan:
    """The server span of one HTTP request; named `METHOD /route/template` when it ends."""

    def __init__(self, span: Span, method: str) -> None:
        self.span = span
        self._method = method

    @property
    def trace_id(self) -> str | None:
        from opentelemetry import trace

        context = self.span.get_span_context()
        return trace.format_trace_id(context.trace_id) if context.is_valid else None

    def finish(self, *, route: str | None, status: int, tenant_id: str | None) -> None:
        from opentelemetry.trace import StatusCode

        if route is not None:
            self.span.update_name(f"{self._method} {route}")
            self.span.set_attribute("http.route", route)
        self.span.set_attribute("http.response.status_code", status)
        if tenant_id is not None:
            self.span.set_attribute("ragservice.tenant_id", tenant_id)
        if status >= 500:  # a server span's error: 5xx only (4xx are the caller's)
            self.span.set_status(StatusCode.ERROR)


class Tracing:
    """A tracer provider and what it instruments. `owned`: created here, shut down on close."""

    def __init__(self, provider: TracerProvider, *, owned: bool) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("ragservice")
        self._owned = owned
        self._instrumented_sql = False

    def stage(self, name: str) -> AbstractContextManager[object]:
        return self.tracer.start_as_current_span(name)

    @contextmanager
    def request(
        self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]], request_id: str
    ) -> Iterator[RequestSpan]:
        """The server span of a request, continuing the caller's trace (`traceparent`)."""
        from opentelemetry.propagate import extract
        from opentelemetry.trace import SpanKind

        carrier = {bytes(k).decode("latin-1"): bytes(v).decode("latin-1") for k, v in headers}
        attributes = {
            "http.request.method": method,
            "url.path": path,
            "ragservice.request_id": request_id,
        }
        with self.tracer.start_as_current_span(
            method,
            context=extract(carrier),
            kind=SpanKind.SERVER,
            attributes=attributes,
            # The middleware sets the status from the response; an exception is still recorded.
            set_status_on_exception=False,
        ) as server_span:
            yield RequestSpan(server_span, method)

    def instrument_engines(self, engines: Sequence[Any]) -> None:
        """Spans for the SQL of these SQLAlchemy engines (statements run on the bare driver
        connection, e.g. the search statements, show as their stage's span instead)."""
        from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

        # The instrumentation declares SQLAlchemy < 2.1; its event hooks work on 2.1 too.
        SQLAlchemyInstrumentor().instrument(
            engines=list(engines), tracer_provider=self.provider, skip_dep_check=True
        )
        self._instrumented_sql = True

    def httpx_transport(self) -> httpx.AsyncBaseTransport:
        """An httpx transport that makes each upstream call a client span and sends the W3C
        `traceparent` with it."""
        import httpx
        from opentelemetry.instrumentation.httpx import AsyncOpenTelemetryTransport

        return AsyncOpenTelemetryTransport(
            httpx.AsyncHTTPTransport(), tracer_provider=self.provider
        )

    def close(self) -> None:
        if self._instrumented_sql:
            from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

            SQLAlchemyInstrumentor().uninstrument()
            self._instrumented_sql = False
        if self._owned:
            self.provider.shutdown()  # exports what is still queued


def check_available(observability: ObservabilitySettings) -> None:
    """Raises ConfigurationError when tracing is on and the `otel` extra is not installed."""
    if observability.tracing and (message := missing_extra("otel", "RAGSERVICE_TRACING")):
        raise ConfigurationError(message)


@contextmanager
def activated(
    observability: ObservabilitySettings, *, provider: TracerProvider | None = None
) -> Iterator[Tracing | None]:
    """Tracing on for the block when `observability.tracing` is set (None otherwise). `provider`:
    use this one (tests, benchmarks) instead of one configured from `OTEL_*`."""
    global _current
    if not observability.tracing:
        yield None
        return
    check_available(observability)
    if _current is not None:
        raise ConfigurationError("tracing is already on in this process")
    tracing = Tracing(provider or provider_from_environment(), owned=provider is None)
    _current = tracing
    timing.set_stage_span(tracing.stage)
    try:
        yield tracing
    finally:
        timing.set_stage_span(None)
        _current = None
        tracing.close()


def provider_from_environment() -> TracerProvider:
    """An SDK provider as the `OTEL_*` variables describe it; the SDK reads the sampler, the
    resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), the batch settings
    (`OTEL_BSP_*`) and each exporter's own variables (`OTEL_EXPORTER_OTLP_*`)."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    # The sampler OTEL_TRACES_SAMPLER names, as the SDK reads it, for the traces requests start.
    configured = TracerProvider(shutdown_on_exit=False).sampler
    provider = TracerProvider(sampler=_requests_only(configured), resource=resource)
    for exporter in exporters_from_environment():
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _requests_only(sampler: Sampler) -> Sampler:
    """`sampler` for traces that start with a request (a server span); nothing is recorded
    of work that starts on its own, such as the job workers' polls and the model registry's
    checks, which would otherwise be a trace of one SQL span every second."""
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
    from opentelemetry.trace import SpanKind, get_current_span

    class RequestsOnly(Sampler):
        def should_sample(  # type: ignore[no-untyped-def]
            self,
            parent_context,
            trace_id,
            name,
            kind=None,
            attributes=None,
            links=None,
            trace_state=None,
        ) -> SamplingResult:
            parent = get_current_span(parent_context).get_span_context()
            if not parent.is_valid and kind is not SpanKind.SERVER:
                return SamplingResult(Decision.DROP)
            return sampler.should_sample(
                parent_context, trace_id, name, kind, attributes, links, trace_state
            )

        def get_description(self) -> str:
            return f"RequestsOnly{{{sampler.get_description()}}}"

    return RequestsOnly()


def exporters_from_environment() -> list[SpanExporter]:
    """`OTEL_TRACES_EXPORTER` (comma-separated, default `otlp`): `otlp` (over HTTP/protobuf),
    `console`, `none`, or any exporter installed under the SDK's entry point names."""
    names = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",")
    exporters: list[SpanExporter] = []
    for name in (n.strip() for n in names):
        if name in ("", "none"):
            continue
        exporters.append(_exporter(name))
    return exporters


def _exporter(name: str) -> SpanExporter:
    from importlib.metadata import entry_points

    if name == "otlp":
        protocol = os.environ.get(
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        )
        if protocol != "http/protobuf":
            raise ConfigurationError(
                f"OTLP protocol {protocol!r} is not supported; ragservice exports traces over "
                "http/protobuf (OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf)"
            )
        name = "otlp_proto_http"
    found = entry_points(group="opentelemetry_traces_exporter", name=name)
    if not found:
        known = sorted(e.name for e in entry_points(group="opentelemetry_traces_exporter"))
        raise ConfigurationError(
            f"OTEL_TRACES_EXPORTER: no trace exporter named {name!r} is installed "
            f"(known: otlp, none, {', '.join(known)})"
        )
    exporter: SpanExporter = next(iter(found)).load()()
    return exporter
