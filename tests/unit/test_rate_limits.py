"""The token bucket per key, on a clock the test moves by hand."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from ragservice.config import Settings
from ragservice.errors import RateLimitedError
from ragservice.limits.rate_limits import RateLimiter, embedding_cost


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_a_key_gets_its_burst_then_waits_for_the_rate(clock: Clock) -> None:
    limiter = RateLimiter(per_second=2, burst=3, clock=clock)
    assert [limiter.acquire("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.acquire("a") == pytest.approx(0.5)  # one token every 1/2 s
    clock.now += 0.25
    assert limiter.acquire("a") == pytest.approx(0.25)  # refused: nothing was taken
    clock.now += 0.25
    assert limiter.acquire("a") == 0.0
    assert limiter.acquire("a") == pytest.approx(0.5)


def test_the_sustained_rate_is_per_second_and_never_above_the_burst(clock: Clock) -> None:
    limiter = RateLimiter(per_second=8, burst=4, clock=clock)
    limiter.acquire("a")
    clock.now += 3600  # an hour idle fills the bucket to the burst, not to 28,800
    start = clock.now
    allowed = 0
    for i in range(33):  # a request every 1/32 s (exact in binary) for one second
        clock.now = start + i / 32
        allowed += limiter.acquire("a") == 0.0
    assert allowed == 4 + 8  # the burst, then the rate for the second that passed


def test_keys_have_separate_buckets(clock: Clock) -> None:
    limiter = RateLimiter(per_second=1, burst=2, clock=clock)
    assert [limiter.acquire("a") for _ in range(2)] == [0.0, 0.0]
    assert limiter.acquire("a") > 0
    assert [limiter.acquire("b") for _ in range(2)] == [0.0, 0.0]
    assert limiter.acquire("b") > 0


def test_buckets_idle_until_full_are_dropped(clock: Clock) -> None:
    limiter = RateLimiter(per_second=10, burst=20, clock=clock)  # full again after 2 s
    for key in range(1000):
        limiter.acquire(key)
    assert len(limiter) == 1000
    clock.now += 1.0
    limiter.acquire("recent")
    assert len(limiter) == 1001  # not yet full: still held
    clock.now += 1.0
    limiter.acquire("recent")
    assert len(limiter) == 1  # the thousand are full: dropped, only "recent" remains


def test_a_dropped_bucket_comes_back_full_as_it_would_have_been(clock: Clock) -> None:
    limiter = RateLimiter(per_second=1, burst=2, clock=clock)
    assert [limiter.acquire("a") for _ in range(3)][-1] > 0
    clock.now += 2.0
    limiter.acquire("other")  # evicts "a", full by now
    assert [limiter.acquire("a") for _ in range(3)] == [0.0, 0.0, pytest.approx(1.0)]


def test_many_threads_never_take_more_than_the_burst(clock: Clock) -> None:
    limiter = RateLimiter(per_second=1, burst=50, clock=clock)  # the clock stands still
    with ThreadPoolExecutor(max_workers=8) as pool:
        waits = list(pool.map(lambda _: limiter.acquire("a"), range(400)))
    assert sum(wait == 0.0 for wait in waits) == 50


def test_settings_build_the_limiter_or_turn_it_off() -> None:
    limiter = RateLimiter.from_settings(
        Settings(rate_limit_per_second=5, rate_limit_burst=7).security
    )
    assert limiter is not None
    assert (limiter.per_second, limiter.burst) == (5, 7)
    assert RateLimiter.from_settings(Settings(rate_limit_per_second=0).security) is None


def test_a_limiter_without_a_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="per_second"):
        RateLimiter(per_second=0, burst=1)


@pytest.mark.parametrize(("seconds", "header"), [(0.001, 1), (0.5, 1), (1.0, 1), (1.2, 2)])
def test_retry_after_is_whole_seconds_and_at_least_one(seconds: float, header: int) -> None:
    assert RateLimitedError("slow down", retry_after=seconds).retry_after == header


def test_a_request_takes_what_it_costs_and_never_more_than_the_burst(clock: Clock) -> None:
    limiter = RateLimiter(per_second=2, burst=10, clock=clock)
    assert limiter.acquire("a", 4) == 0.0
    assert limiter.acquire("a", 4) == 0.0
    assert limiter.acquire("a", 4) == pytest.approx(1.0)  # 2 left, 2 short: a second at 2/s
    assert limiter.acquire("a", 2) == 0.0  # the refusal took nothing
    clock.now += 5.0  # full again
    assert limiter.acquire("a", 100) == 0.0  # costs the whole bucket, so it can ever pass
    assert limiter.acquire("a") == pytest.approx(0.5)


@pytest.mark.parametrize(("texts", "cost"), [(1, 1), (16, 1), (17, 2), (256, 16), (2048, 128)])
def test_embeddings_cost_a_token_per_sixteen_texts(texts: int, cost: int) -> None:
    assert embedding_cost(texts) == cost


def test_waiting_says_when_a_token_is_back_and_takes_none(clock: Clock) -> None:
    limiter = RateLimiter(per_second=0.5, burst=2, clock=clock)
    assert limiter.waiting("addr") == 0.0  # never seen: a full bucket
    limiter.acquire("addr")
    limiter.acquire("addr")
    assert limiter.waiting("addr") == pytest.approx(2.0)
    assert limiter.waiting("addr") == pytest.approx(2.0)  # asking took nothing
    clock.now += 2.0
    assert limiter.waiting("addr") == 0.0
    assert limiter.acquire("addr") == 0.0
