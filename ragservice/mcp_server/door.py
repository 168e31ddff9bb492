"""The door of the MCP server over HTTP: only a live API key gets in, and a stream that carries
nothing is not held open.

- Every HTTP request must bring `Authorization: Bearer <key>`, and the key must be one the REST
  API accepts: the door asks it (`GET /v1/me`, which any valid key may call) before the request
  reaches the MCP server, so a wrong, expired or revoked key is a 401 before any MCP message is
  read or written. The API's answer is remembered per key (by its SHA-256, never the key)
  for `ttl` seconds when the key is good, so a revoked key is refused within `ttl`, and for
  `refused_ttl` seconds when it was refused. Other failures (the API unreachable: 503, or
  rate limited: 429) are passed on and not remembered.
- A GET request's event stream (the one for server-initiated messages; a stateless server never
  sends any) is ended after `idle_timeout` seconds without a message; keep-alive comments do
  not count. A POST's stream ends with its own call.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ragservice.errors import AuthenticationError, RagServiceError, RateLimitedError

Verify = Callable[[str], object]
"""Asks the REST API about a key (blocking); raises the service's error when it is refused."""

KEY_TTL_SECONDS = 5.0
REFUSED_TTL_SECONDS = 1.0
IDLE_TIMEOUT_SECONDS = 60.0
_MAX_KEYS = 10_000  # keys remembered at most; the oldest are forgotten first


def bearer_token(headers: Any) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, if the headers have one."""
    if headers is None:
        return None
    scheme, _, token = str(headers.get("authorization") or "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class KeyCheck:
    """Whether a bearer token is a live API key, as the REST API says, remembered briefly."""

    def __init__(
        self,
        verify: Verify,
        *,
        ttl: float = KEY_TTL_SECONDS,
        refused_ttl: float = REFUSED_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._verify = verify
        self._ttl = ttl
        self._refused_ttl = min(refused_ttl, ttl)
        self._clock = clock
        # SHA-256 of the key → (until when, the refusal's message or None for a good key)
        self._known: dict[str, tuple[float, str | None]] = {}

    async def __call__(self, token: str) -> None:
        """Returns for a live key; raises `AuthenticationError` for a refused one, or the
        error that kept the API from answering."""
        digest = hashlib.sha256(token.encode()).hexdigest()
        known = self._known.get(digest)
        if known is not None and known[0] > self._clock():
            if known[1] is not None:
                raise AuthenticationError(known[1])
            return
        try:
            await anyio.to_thread.run_sync(self._verify, token)
        except AuthenticationError as exc:
            self._remember(digest, self._refused_ttl, str(exc))
            raise
        self._remember(digest, self._ttl, None)

    def _remember(self, digest: str, ttl: float, refusal: str | None) -> None:
        now = self._clock()
        self._known.pop(digest, None)
        self._known[digest] = (now + ttl, refusal)
        if len(self._known) > _MAX_KEYS:
            for stale in [key for key, (until, _) in self._known.items() if until <= now]:
                del self._known[stale]
            while len(self._known) > _MAX_KEYS:
                del self._known[next(iter(self._known))]


class Door:
    """ASGI middleware: the key check before anything else, and idle GET streams ended."""

    def __init__(
        self, app: ASGIApp, *, check: KeyCheck, idle_timeout: float = IDLE_TIMEOUT_SECONDS
    ) -> None:
        self.app = app
        self.check = check
        self.idle_timeout = idle_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = bearer_token(Headers(scope=scope))
        try:
            if token is None:
                raise AuthenticationError("send your API key as a bearer token")
            await self.check(token)
        except RagServiceError as exc:
            await _refusal(exc)(scope, receive, send)
            return
        if scope["method"] == "GET":
            await _ended_when_idle(self.app, self.idle_timeout, scope, receive, send)
        else:
            await self.app(scope, receive, send)


def _refusal(exc: RagServiceError) -> JSONResponse:
    kind = type(exc).__name__.removesuffix("Error")
    headers = {}
    if isinstance(exc, AuthenticationError):
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(exc, RateLimitedError):
        headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    status = exc.status_code if exc.status_code < 500 else 503  # the API is what failed
    return JSONResponse({"error": kind, "detail": str(exc)}, status_code=status, headers=headers)


async def _ended_when_idle(
    app: ASGIApp, timeout: float, scope: Scope, receive: Receive, send: Send
) -> None:
    """Runs `app`, ending its response once `timeout` seconds pass without a message."""
    last = anyio.current_time()
    started = finished = False

    async def watched(message: Message) -> None:
        nonlocal last, started, finished
        if message["type"] == "http.response.start":
            started = True
        elif message["type"] == "http.response.body":
            body = message.get("body", b"")
            if body and not body.startswith(b":"):  # a message; a comment is a keep-alive
                last = anyio.current_time()
            finished = not message.get("more_body", False)
        await send(message)

    async def watch(group: anyio.abc.TaskGroup) -> None:
        while (left := last + timeout - anyio.current_time()) > 0:
            await anyio.sleep(left)
        group.cancel_scope.cancel()

    async with anyio.create_task_group() as group:
        group.start_soon(watch, group)
        await app(scope, receive, watched)
        group.cancel_scope.cancel()
    if not started:
        await JSONResponse({"error": "Timeout", "detail": "idle"}, status_code=503)(
            scope, receive, send
        )
    elif not finished:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
