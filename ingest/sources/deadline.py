"""Deadlines of a source's run: on the whole run, and on each answer a crawl waits for.

A timeout on each read does not bound an answer whose bytes trickle in (one byte a second
never times out), nor a run. `Deadline` is the point in time a client's connects, writes and
reads may not pass: each one waits no longer than the time left (`guard.guarded_client` takes
one), so an answer ends at its deadline however its bytes come. `RunDeadline` stops any reader's
scan once the run's time is up, between two documents; the sync then keeps what was written
and deletes nothing, as for any run that fails halfway (`ingest.sources.sync`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpcore

from ingest.sources.base import ItemState, ScanEvent, SourceError, SourceReader

Clock = Callable[[], float]


class RunOverdue(SourceError):
    """The run went past its deadline: it stops here (failed), keeping what it wrote."""

    def __init__(self, seconds: float) -> None:
        super().__init__(
            f"the run stopped at its deadline of {seconds:g} s (RAGSERVICE_SOURCE_RUN_SECONDS, "
            "or the source's run_seconds); what it wrote is kept, nothing was deleted, and the "
            "next run goes on from there"
        )
        self.seconds = seconds


class RunYielded(SourceError):
    """The run took its turn while another tenant's job waited: it stops here, done for now,
    keeping what it wrote; its next run goes on from there."""

    def __init__(self, seconds: float) -> None:
        super().__init__(
            f"the run gave its job thread up after {seconds:g} s while another tenant's job "
            "waited (RAGSERVICE_SOURCE_TURN_SECONDS); what it wrote is kept, nothing was "
            "deleted, and its next run is queued to go on from there"
        )
        self.seconds = seconds


WAITING_CHECK_SECONDS = 1.0
"""How often, at most, a run past its turn asks whether another tenant's job waits."""


class Deadline:
    """When the requests of one client must be over (`clock()` time; None: no deadline).
    Set before each request; the guarded client's streams read it at every connect, write
    and read."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.at: float | None = None
        self.clock = clock

    def left(self) -> float | None:
        return None if self.at is None else self.at - self.clock()

    def cap(self, timeout: float | None, expired: type[Exception]) -> float | None:
        """`timeout` shortened to the time left; raises `expired` once none is left."""
        left = self.left()
        if left is None:
            return timeout
        if left <= 0:
            raise expired("the deadline passed")
        return left if timeout is None else min(timeout, left)


class DeadlineStream(httpcore.NetworkStream):
    """A network stream whose every wait is cut at its `Deadline`."""

    def __init__(self, stream: httpcore.NetworkStream, deadline: Deadline) -> None:
        self._stream = stream
        self._deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, self._deadline.cap(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, self._deadline.cap(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        capped = self._deadline.cap(timeout, httpcore.ConnectTimeout)
        return DeadlineStream(
            self._stream.start_tls(ssl_context, server_hostname, capped), self._deadline
        )

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class RunDeadline:
    """`reader`, whose scan raises `RunOverdue` once `seconds` have passed since it began
    (checked after each document; a reader that waits on the network bounds its own waits
    by the same deadline, as the web reader does). Its other attributes are the reader's.

    With `others_waiting` (a worker's run), the scan also raises `RunYielded` once `turn`
    seconds have passed and `others_waiting()` says another tenant's job waits for a thread
    (asked at most every `WAITING_CHECK_SECONDS`)."""

    def __init__(
        self,
        reader: SourceReader,
        seconds: float,
        clock: Clock = time.monotonic,
        *,
        turn: float | None = None,
        others_waiting: Callable[[], bool] | None = None,
    ) -> None:
        self.reader = reader
        self.seconds = seconds
        self.clock = clock
        self.turn = turn
        self.others_waiting = others_waiting

    def scan(self, known: Mapping[str, ItemState]) -> Iterator[ScanEvent]:
        began = self.clock()
        due = began + self.seconds
        ask_at = None if self.turn is None or self.others_waiting is None else began + self.turn
        events = self.reader.scan(known)
        try:
            for event in events:
                yield event
                now = self.clock()
                if now >= due:
                    raise RunOverdue(self.seconds)
                if ask_at is not None and now >= ask_at:
                    assert self.others_waiting is not None
                    if self.others_waiting():
                        raise RunYielded(round(now - began, 1))
                    ask_at = now + WAITING_CHECK_SECONDS
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()  # a generator's `with` blocks (a crawl's client) end now

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reader, name)
