"""ASGI middleware: a request id on every request and response (and on its log lines, its
trace and its access line), the request body limit, and the database scope of each request
(its consistency token in and out, its deferred writes).

Written as plain ASGI rather than `BaseHTTPMiddleware`, which costs a task switch per request.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import anyio.to_thread
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ragservice.db.scope import (
    CONSISTENCY_HEADER,
    READ_NODE_HEADER,
    RequestScope,
    parse_token,
    request_scope,
)
from ragservice.errors import BadRequestError
from ragservice.metrics import Metrics
from ragservice.observability import logs, tracing

log = logging.getLogger(__name__)
access_log = logging.getLogger(logs.ACCESS_LOGGER)

REQUEST_ID_HEADER = "x-request-id"
_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")  # whole: fullmatch


class RequestContextMiddleware:
    """Gives each request an id (the caller's `X-Request-ID` when it is safe to echo), refuses
    bodies over `max_body_bytes` with 413 (by header or while streaming), and opens the
    request's database scope: the caller's `X-Consistency-Token` in, the token of the
    request's writes and the node that served its reads out, and the deferred writes run
    after the response is sent.

    The request's log lines carry its id, tenant and route (`observability.logs`); while
    tracing is on the request is a server span (continuing the caller's `traceparent`) whose
    trace id goes out as `X-Trace-ID`. `access_log`: one `ragservice.access` line per request.
    """

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, access_log: bool = False) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = _request_id(scope)
        scope.setdefault("state", {})["request_id"] = request_id
        info = logs.RequestInfo(request_id, scope)
        response = _Response()
        with logs.request_context(info), _server_span(scope, request_id) as span:
            headers = [(REQUEST_ID_HEADER, request_id)]
            if span is not None and span.trace_id is not None:
                headers.append((tracing.TRACE_ID_HEADER, span.trace_id))
            try:
                await self._scoped(scope, receive, response.watch(send, headers), request_id)
            finally:
                if span is not None:
                    span.finish(route=info.route, status=response.status, tenant_id=info.tenant)
                if self.access_log:
                    _log_access(scope, info, response, started)

    async def _scoped(self, scope: Scope, receive: Receive, send: Send, request_id: str) -> None:
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await _error(413, "PayloadTooLarge", self._too_large(), request_id)(
                scope, receive, send
            )
            return
        try:
            min_lsn = _consistency_token(scope)
        except BadRequestError as exc:
            await _error(400, "BadRequest", str(exc), request_id)(scope, receive, send)
            return

        # Safe methods may read on a replica; routes that only read opt in (`deps.replica_reads`).
        replica_reads = scope["method"] in ("GET", "HEAD")
        with request_scope(replica_reads=replica_reads, min_lsn=min_lsn) as db_scope:

            async def send_with_context(message: Message) -> None:
                if message["type"] == "http.response.start":
                    headers = [*message.get("headers", []), *_scope_headers(db_scope)]
                    message = {**message, "headers": headers}
                await send(message)

            try:
                await self.app(scope, self._limited(receive), send_with_context)
            finally:
                if db_scope.deferred:
                    await _run_deferred(scope, db_scope)

    def _limited(self, receive: Receive) -> Receive:
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    # An HTTPException passes through FastAPI's body parsing untouched.
                    raise HTTPException(413, self._too_large())
            return message

        return limited_receive

    def _too_large(self) -> str:
        return (
            f"request body exceeds {self.max_body_bytes} bytes "
            "(RAGSERVICE_MAX_BODY_BYTES); split the upload into smaller requests"
        )


@dataclass
class _Response:
    """What a request answered: its status (500 until a response starts) and when its last
    byte went out."""

    status: int = 500
    finished: float | None = None

    def watch(self, send: Send, headers: list[tuple[str, str]]) -> Send:
        """`send`, noting the status and the end, with `headers` added where absent."""
        extra = [(name.encode(), value.encode()) for name, value in headers]

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.status = int(message["status"])
                present = {name.lower() for name, _ in message.get("headers", [])}
                added = [(name, value) for name, value in extra if name not in present]
                message = {**message, "headers": [*message.get("headers", []), *added]}
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                self.finished = time.perf_counter()
            await send(message)

        return watched


def _server_span(
    scope: Scope, request_id: str
) -> AbstractContextManager[tracing.RequestSpan | None]:
    active = tracing.current()
    if active is None:
        return nullcontext()
    return active.request(scope["method"], scope["path"], scope.get("headers", []), request_id)


def _log_access(scope: Scope, info: logs.RequestInfo, response: _Response, started: float) -> None:
    """The request's access line; its duration runs to the response's last byte (the writes
    deferred past it are not the caller's wait)."""
    duration_ms = round(((response.finished or time.perf_counter()) - started) * 1000, 2)
    route = info.route
    access_log.info(
        "%s %s %d %.1fms",
        scope["method"],
        scope["path"],
        response.status,
        duration_ms,
        extra={
            "method": scope["method"],
            "path": scope["path"],
            "route": route or "unmatched",
            "status": response.status,
            "duration_ms": duration_ms,
        },
    )


def _error(status: int, error: str, detail: str, request_id: str) -> JSONResponse:
    return JSONResponse(
        {"error": error, "detail": detail, "request_id": request_id},
        status_code=status,
        headers={REQUEST_ID_HEADER: request_id},
    )


def _consistency_token(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == CONSISTENCY_HEADER.encode():
            return parse_token(bytes(value).decode("latin-1"))
    return None


def _scope_headers(db_scope: RequestScope) -> list[tuple[bytes, bytes]]:
    headers = []
    token = db_scope.token()
    if token is not None:
        headers.append((CONSISTENCY_HEADER.encode(), token.encode()))
    if db_scope.read_node is not None:
        headers.append((READ_NODE_HEADER.encode(), db_scope.read_node.encode()))
    return headers


async def _run_deferred(scope: Scope, db_scope: RequestScope) -> None:
    """The request's deferred writes (query log, cache stores), after the response is sent."""
    runtime = getattr(scope["app"].state, "runtime", None)
    if runtime is None:
        log.warning(
            "%d deferred writes dropped: the service is not started", len(db_scope.deferred)
        )
        return
    writes, db_scope.deferred = db_scope.deferred, []
    with tracing.span("log_write"):
        await anyio.to_thread.run_sync(runtime.db.run_writes, writes)


def _request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", []):
        if name == REQUEST_ID_HEADER.encode():
            candidate = bytes(value).decode("latin-1")
            if _SAFE_REQUEST_ID.fullmatch(candidate):
                return candidate
    return uuid.uuid4().hex


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class MetricsMiddleware:
    """Counts requests by route template (not raw path: ids would explode the label set)."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        finished: float | None = None
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status, finished
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                finished = time.perf_counter()
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            # Up to the response's last byte: writes deferred past it are not the caller's wait.
            route = getattr(scope.get("route"), "path", "unmatched")
            seconds = (finished or time.perf_counter()) - started
            self.metrics.observe_request(route, scope["method"], status, seconds)
