"""ASGI middleware: a request id on every request and response, and the request body limit.

Written as plain ASGI rather than `BaseHTTPMiddleware`, which costs a task switch per request.
"""

from __future__ import annotations

import re
import time
import uuid

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ragservice.metrics import Metrics

REQUEST_ID_HEADER = "x-request-id"
_SAFE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class RequestContextMiddleware:
    """Gives each request an id (the caller's `X-Request-ID` when it is safe to echo) and
    refuses bodies over `max_body_bytes` with 413, by header or while streaming."""

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
            response = JSONResponse(
                {"error": "PayloadTooLarge", "detail": self._too_large(), "request_id": request_id},
                status_code=413,
                headers={REQUEST_ID_HEADER: request_id},
            )
            await response(scope, receive, send)
            return

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((REQUEST_ID_HEADER.encode(), request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, self._limited(receive), send_with_id)

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
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            seconds = time.perf_counter() - started
            self.metrics.observe_request(route, scope["method"], status, seconds)
