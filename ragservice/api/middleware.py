"""ASGI middleware: a request id on every request and response, the request body limit, and
the database scope of each request (its consistency token in and out, its deferred writes).

Written as plain ASGI rather than `BaseHTTPMiddleware`, which costs a task switch per request.
"""

from __future__ import annotations

import logging
import re
import time
import uuid

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

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "x-request-id"
_SAFE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class RequestContextMiddleware:
    """Gives each request an id (the caller's `X-Request-ID` when it is safe to echo), refuses
    bodies over `max_body_bytes` with 413 (by header or while streaming), and opens the
    request's database scope: the caller's `X-Consistency-Token` in, the token of the
    request's writes and the node that served its reads out, and the deferred writes run
    after the response is sent."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _request_id(scope)
        scope.setdefault("state", {})["request_id"] = request_id
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
                    headers = list(message.get("headers", []))
                    if all(name != REQUEST_ID_HEADER.encode() for name, _ in headers):
                        headers.append((REQUEST_ID_HEADER.encode(), request_id.encode()))
                    headers.extend(_scope_headers(db_scope))
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
    await anyio.to_thread.run_sync(runtime.db.run_writes, writes)


def _request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", []):
        if name == REQUEST_ID_HEADER.encode():
            candidate = bytes(value).decode("latin-1")
            if _SAFE_REQUEST_ID.match(candidate):
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
