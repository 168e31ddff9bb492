"""The FastAPI application. Routes stay thin: they translate HTTP and call the service layer."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import SecretStr

from ragservice import console
from ragservice.answering.inference import InferenceClient
from ragservice.api.authn import AuthMiddleware, failure_limiter
from ragservice.api.deps import storable_parameters
from ragservice.api.error_handlers import install_error_handlers
from ragservice.api.middleware import MetricsMiddleware, RequestContextMiddleware
from ragservice.api.routers import (
    account,
    admin,
    collections,
    documents,
    embedding_models,
    feedback,
    jobs,
    openai,
    query,
    search,
    sources,
)
from ragservice.api.stopping import JOBS_SHARE, Stopping
from ragservice.auth.tokens import TokenVerifier
from ragservice.cache.prompt_cache import CachePurger
from ragservice.config import SecuritySettings, Settings, get_settings, is_loopback
from ragservice.db import tenancy
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from ragservice.errors import AuthenticationError, ConfigurationError
from ragservice.limits.rate_limits import RateLimiter
from ragservice.metrics import JobMetrics, Metrics
from ragservice.observability import tracing
from ragservice.retention import RetentionPurger
from ragservice.runtime import Runtime
from ragservice.runtime_metrics import runtime_collectors
from ragservice.services.composition import open_serving_runtime, query_services

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger(__name__)


class BackgroundService(Protocol):
    """Something that runs beside the API for the app's lifetime (e.g. ingest job workers)."""

    def start(self) -> None: ...

    def stop(self, timeout: float) -> None: ...


@runtime_checkable
class StopsInTheBackground(Protocol):
    """A background service that can begin to stop at signal time, without waiting (the
    ingest job workers: their jobs go back to the queue while open responses end)."""

    def request_stop(self) -> None: ...


class ServiceFactory(Protocol):
    """Builds a background service on the app's runtime; `metrics` counts its ingest jobs."""

    def __call__(self, runtime: Runtime, *, metrics: JobMetrics) -> BackgroundService: ...


def create_app(
    settings: Settings | None = None,
    *,
    embedder: SentenceTransformerEmbedder | None = None,
    services: Sequence[ServiceFactory] = (),
    tracer_provider: TracerProvider | None = None,
) -> FastAPI:
    """Build the app; the database and the model open in the lifespan, not at import.

    `embedder` shares an already loaded model (tests). `services` start with the app and
    stop with it; the server passes the ingest job workers here (their jobs are counted in the
    app's metrics). `tracer_provider`: the provider of the app's spans when RAGSERVICE_TRACING
    is on (default: one configured from the OTEL_* variables).
    """
    resolved = settings or get_settings()
    check_auth_binding(resolved.security, resolved.server.host)
    tracing.check_available(resolved.observability)

    metrics = Metrics()
    stopping = Stopping(resolved.server.shutdown_grace_seconds)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stopping.bind(asyncio.get_running_loop())
        # Each part is closed in reverse order even when a later one fails to start.
        async with AsyncExitStack() as stack:
            traced = stack.enter_context(
                tracing.activated(resolved.observability, provider=tracer_provider)
            )
            runtime = open_serving_runtime(resolved, embedder=embedder)
            stack.callback(runtime.close)
            if traced is not None:
                traced.instrument_engines(runtime.db.engines())
            app.state.runtime = runtime
            runtime.models.start()  # follows `ragservice models activate` without a restart
            inference = InferenceClient.from_settings(
                resolved,
                owner=tenancy.current_tenant_id,
                transport=None if traced is None else traced.httpx_transport(),
            )
            if inference is not None:
                stack.push_async_callback(inference.aclose)
            query = stack.enter_context(
                query_services(runtime, inference=inference, metrics=metrics)
            )
            app.state.search, app.state.answers = query.search, query.answers
            stack.callback(metrics.watch(runtime_collectors(runtime)))
            app.state.services = _start_services(stack, runtime, services, metrics.jobs, stopping)
            observability = resolved.observability
            if observability.metrics_port is not None:
                _serve_metrics(
                    stack, metrics, observability.metrics_host, observability.metrics_port
                )
            if resolved.security.auth_disabled:
                log.warning("authentication is OFF: every request is the default tenant's admin")
            try:
                yield
            finally:
                stopping.begin()  # already begun at the signal, unless stopped without one

    app = FastAPI(
        title="ragservice",
        version="0.1.0",
        description="RAG and vector search on PostgreSQL + pgvector.",
        lifespan=lifespan,
        dependencies=[Depends(storable_parameters)],
    )
    app.state.metrics = metrics
    app.state.stopping = stopping  # begun at signal time by `ragservice serve` (cli/serve.py)
    app.state.rate_limiter = RateLimiter.from_settings(resolved.security)  # see deps.rate_limit
    install_error_handlers(app)
    # Innermost first: the key is checked within the request's scope, before the body is read.
    app.add_middleware(
        AuthMiddleware,
        failures=failure_limiter(resolved.security.auth_failures_per_minute),
        tokens=TokenVerifier.from_settings(resolved.security),
        groups_from=resolved.security.jwt_groups_from,
    )
    app.add_middleware(
        RequestContextMiddleware,
        max_body_bytes=resolved.limits.max_body_bytes,
        access_log=resolved.observability.log_format == "json",
    )
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    for module in (
        account,
        collections,
        documents,
        jobs,
        search,
        query,
        openai,
        feedback,
        admin,
        embedding_models,
        sources,
    ):
        # Starlette's multipart parser stops at 1,000 files unless told the configured limit.
        app.include_router(
            module.router, form_limits={"max_files": resolved.limits.max_files_per_upload}
        )
    _add_health_routes(app)
    console.mount(app, resolved.server)
    if resolved.observability.metrics_port is None:
        _add_metrics_route(app, metrics, resolved.observability.metrics_token)
    return app


def _start_services(
    stack: AsyncExitStack,
    runtime: Runtime,
    factories: Sequence[ServiceFactory],
    job_metrics: JobMetrics,
    stopping: Stopping,
) -> list[BackgroundService]:
    """Start the background services; they stop by `JOBS_SHARE` of the grace after the stop
    began, those that can beginning at once (`StopsInTheBackground`)."""
    cache = runtime.settings.cache
    started: list[BackgroundService] = []
    parts = [factory(runtime, metrics=job_metrics) for factory in factories]
    if cache.enabled:
        parts.append(CachePurger(runtime.db, interval=cache.purge_seconds))
    parts.append(RetentionPurger(runtime.db, runtime.settings.retention))
    for service in parts:
        service.start()
        stack.callback(_stop_quietly, service, stopping)
        if isinstance(service, StopsInTheBackground):
            stack.callback(stopping.watch(service.request_stop))
        started.append(service)
    return started


def _stop_quietly(service: BackgroundService, stopping: Stopping) -> None:
    try:
        service.stop(stopping.remaining(JOBS_SHARE))
    except Exception:  # one service failing to stop must not keep the others running
        log.exception("stopping %r failed", service)


def check_auth_binding(security: SecuritySettings, host: str) -> None:
    """Authentication may be off only for a server that listens on loopback alone."""
    if security.auth_disabled and not is_loopback(host):
        raise ConfigurationError(
            f"RAGSERVICE_AUTH_DISABLED is set but the server binds {host!r}; "
            "authentication can only be off on a loopback address such as 127.0.0.1"
        )


def _serve_metrics(stack: AsyncExitStack, metrics: Metrics, host: str, port: int) -> None:
    """`/metrics` on a bind of its own (RAGSERVICE_METRICS_PORT), for the app's lifetime."""
    stack.callback(metrics.serve(host, port))


def _add_metrics_route(app: FastAPI, metrics: Metrics, token: SecretStr | None) -> None:
    @app.get("/metrics", tags=["health"], response_class=Response)
    def prometheus_metrics(request: Request) -> Response:
        """Prometheus metrics: requests, latencies per route and pipeline stage, upstream
        errors, ingest jobs, the job queue, replicas, the process (docs/operators.md#metrics).
        With RAGSERVICE_METRICS_TOKEN set, only for `Authorization: Bearer <token>`."""
        if token is not None and not _bearer_matches(request, token):
            raise AuthenticationError(
                "/metrics needs `Authorization: Bearer <RAGSERVICE_METRICS_TOKEN>`"
            )
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


def _bearer_matches(request: Request, token: SecretStr) -> bool:
    scheme, _, sent = request.headers.get("authorization", "").partition(" ")
    expected = token.get_secret_value().encode()
    return scheme.lower() == "bearer" and secrets.compare_digest(sent.strip().encode(), expected)


def _add_health_routes(app: FastAPI) -> None:
    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    def readyz(request: Request) -> JSONResponse:
        """Readiness: primary reachable, schema current, model loaded: 200 `{"status": "ok"}`,
        else 503 `{"status": "unavailable"}`. The details (checks, model, replicas) are for
        admin keys: `GET /v1/admin/health`."""
        ready, _ = admin.readiness(request.app.state.runtime)
        return JSONResponse(
            {"status": "ok" if ready else "unavailable"}, status_code=200 if ready else 503
        )
