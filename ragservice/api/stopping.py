"""The server stopping: a bounded, graceful stop within RAGSERVICE_SHUTDOWN_GRACE_SECONDS.

uvicorn, on SIGTERM or SIGINT, stops accepting connections and then waits for the open
responses before it runs the app's shutdown; a streamed answer can last minutes. So `Stopping`
is begun at signal time (`cli/serve.py` hooks uvicorn's signal handling), before that wait:
streamed answers end with a last event saying the server is stopping (`next_unless_stopping`),
and the ingest job workers begin to put their jobs back in the queue. The grace is then shared
out from the signal on:

- `DRAIN_SHARE`: how long uvicorn waits for responses still open (its graceful timeout; it
  cancels what is left after);
- `JOBS_SHARE`: by when the job workers have stopped (they began at the signal too);
- the rest: closing the pools and stopping the embedded PostgreSQL.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import anyio
from starlette.requests import Request

from ragservice.errors import ServiceStoppingError

log = logging.getLogger(__name__)

DRAIN_SHARE = 0.6
JOBS_SHARE = 0.7

STOPPING_DETAIL = "the server is stopping: this answer was cut short; ask again"

T = TypeVar("T")


class Stopping:
    """Set once when the server begins to stop; callbacks registered with `watch` then run on
    the event loop. `begin` may be called from any thread or a signal handler."""

    def __init__(self, grace_seconds: float) -> None:
        self.grace_seconds = grace_seconds
        self._began: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watchers: dict[int, Callable[[], None]] = {}
        self._next_id = 0

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the callbacks run on (the app's, bound at startup)."""
        self._loop = loop

    @property
    def is_set(self) -> bool:
        return self._began is not None

    def begin(self) -> None:
        """Begin to stop (again: nothing); the grace counts from the first call."""
        if self._began is not None:
            return
        self._began = time.monotonic()
        log.info("stopping: streams end now, jobs go back to the queue")
        loop = self._loop
        if loop is None or loop.is_closed():
            self._fire()
        else:
            loop.call_soon_threadsafe(self._fire)

    def remaining(self, share: float = 1.0) -> float:
        """Seconds left of `share` of the grace (all of it before `begin`)."""
        allowed = self.grace_seconds * share
        if self._began is None:
            return allowed
        return max(self._began + allowed - time.monotonic(), 0.0)

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` on the loop when the stop begins; returns the function that
        unregisters it. Registered after the stop began, it is called soon after."""
        watcher_id = self._next_id
        self._next_id += 1
        self._watchers[watcher_id] = callback
        if self.is_set and self._loop is not None:
            self._loop.call_soon_threadsafe(self._fire)

        def unwatch() -> None:
            self._watchers.pop(watcher_id, None)

        return unwatch

    def _fire(self) -> None:
        for watcher_id, callback in list(self._watchers.items()):
            self._watchers.pop(watcher_id, None)
            try:
                callback()
            except Exception:
                log.exception("a stop callback failed")


async def next_unless_stopping(events: AsyncIterator[T], stopping: Stopping) -> T | None:
    """The next item of `events`, or None once the server is stopping: the step in progress
    (waiting for the next token upstream, say) is cancelled, which ends `events`.
    StopAsyncIteration and the errors of `events` pass through."""
    if stopping.is_set:
        return None
    with anyio.CancelScope() as scope:
        unwatch = stopping.watch(scope.cancel)
        try:
            return await anext(events)
        finally:
            unwatch()
    return None


async def first_unless_stopping(events: AsyncIterator[T], stopping: Stopping) -> T:
    """The first item of a stream, awaited before its 200 is sent: ServiceStoppingError (a
    503) when the server begins to stop meanwhile."""
    first = await next_unless_stopping(events, stopping)
    if first is None:
        raise ServiceStoppingError(STOPPING_DETAIL)
    return first


def stopping_of(request: Request) -> Stopping:
    """The app's `Stopping` (`api/app.py` sets it)."""
    stopping: Stopping = request.app.state.stopping
    return stopping
