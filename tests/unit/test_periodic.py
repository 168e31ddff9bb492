"""`Periodic`: background rounds that survive a failing round and stop when told."""

from __future__ import annotations

import threading

import pytest

from ragservice.periodic import Periodic


def test_rounds_go_on_after_a_failure_and_stop_when_told(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []
    third = threading.Event()

    def task() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("first round breaks")
        if len(calls) == 3:
            third.set()

    rounds = Periodic("test-rounds", task, 0.001, what="the test task", at_start=True)
    rounds.start()
    assert third.wait(10)
    rounds.stop(10)
    stopped_at = len(calls)
    assert stopped_at >= 3
    assert "the test task failed; the next round tries again" in caplog.text
    assert not any(t.name == "test-rounds" for t in threading.enumerate())
    assert len(calls) == stopped_at


def test_without_at_start_nothing_runs_before_the_first_interval() -> None:
    ran = threading.Event()
    rounds = Periodic("test-later", ran.set, 3600, what="the later task")
    rounds.start()
    rounds.stop(10)  # within the first interval: the task never ran
    assert not ran.is_set()
