"""The server's stop as streamed answers see it (api/stopping.py), without a server."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator

import pytest

from ragservice.api.stopping import Stopping, first_unless_stopping, next_unless_stopping
from ragservice.errors import ServiceStoppingError


async def one_then_hang(closed: list[str]) -> AsyncGenerator[str, None]:
    """An upstream that sends one piece and then nothing (a long pause between tokens)."""
    try:
        yield "first"
        await asyncio.Event().wait()
        yield "never"
    finally:
        closed.append("closed")


def test_a_stop_from_another_thread_ends_the_wait_for_the_next_piece() -> None:
    async def main() -> None:
        stopping = Stopping(10.0)
        stopping.bind(asyncio.get_running_loop())
        closed: list[str] = []
        events = one_then_hang(closed)
        assert await next_unless_stopping(events, stopping) == "first"
        threading.Timer(0.05, stopping.begin).start()  # as a signal handler would, any time
        assert await asyncio.wait_for(next_unless_stopping(events, stopping), 10) is None
        assert closed == ["closed"]  # the step was cancelled inside the generator
        assert await next_unless_stopping(events, stopping) is None  # stopped for good
        assert 9.0 < stopping.remaining() <= 10.0
        assert 6.0 < stopping.remaining(0.7) <= 7.0

    asyncio.run(main())


def test_errors_and_the_end_pass_through_and_a_stop_before_the_first_piece_is_a_503() -> None:
    async def failing() -> AsyncGenerator[str, None]:
        yield "piece"
        raise ValueError("upstream broke")

    async def main() -> None:
        stopping = Stopping(10.0)
        stopping.bind(asyncio.get_running_loop())
        events = failing()
        assert await first_unless_stopping(events, stopping) == "piece"
        with pytest.raises(ValueError, match="upstream broke"):
            await next_unless_stopping(events, stopping)
        with pytest.raises(StopAsyncIteration):
            await next_unless_stopping(events, stopping)
        assert stopping.remaining() == 10.0  # the grace counts from the stop only
        stopping.begin()
        with pytest.raises(ServiceStoppingError, match="stopping"):
            await first_unless_stopping(one_then_hang([]), stopping)

    asyncio.run(main())


def test_callbacks_run_once_on_the_loop_and_late_ones_soon_after() -> None:
    async def main() -> None:
        stopping = Stopping(1.0)
        stopping.bind(asyncio.get_running_loop())
        calls: list[str] = []
        stopping.watch(lambda: calls.append("early"))
        unwatched = stopping.watch(lambda: calls.append("unwatched"))
        unwatched()
        stopping.begin()
        stopping.begin()  # a second signal: nothing more
        await asyncio.sleep(0.01)
        stopping.watch(lambda: calls.append("late"))
        await asyncio.sleep(0.01)
        assert calls == ["early", "late"]

    asyncio.run(main())
