"""Stage timings: a stage that runs twice adds up, a failing block is still timed."""

from __future__ import annotations

import time

import pytest

from ragservice.timing import add_ms, timed, with_total


def test_a_stage_that_runs_twice_adds_up() -> None:
    timings: dict[str, float] = {}
    add_ms(timings, "embed", 1.5)
    add_ms(timings, "embed", 2.25)
    assert timings == {"embed": 3.75}


def test_a_block_that_raises_is_timed_all_the_same() -> None:
    timings: dict[str, float] = {}
    with pytest.raises(RuntimeError), timed(timings, "search"):
        raise RuntimeError("boom")
    assert list(timings) == ["search"]
    assert timings["search"] >= 0


def test_the_total_covers_every_stage_and_stages_are_rounded() -> None:
    started = time.perf_counter()
    timings: dict[str, float] = {}
    with timed(timings, "a"):
        time.sleep(0.002)
    add_ms(timings, "b", 0.123456)
    result = with_total(timings, started)
    assert result["b"] == 0.123
    assert result["total"] >= result["a"] >= 2.0
