"""Per-key rate limits: a token bucket for each key, held in this process's memory.

A bucket holds up to `burst` tokens and gains `per_second` of them each second; a request
takes what it costs: one, more for the requests that cost the service more (`ANSWER_COST`,
`embedding_cost`; never more than `burst`, or it could never pass). A bucket short of the cost
refuses the request and says how long until enough tokens are back.
Buckets live in process memory, so each server process limits on its own: N processes behind
a load balancer let a key make up to N times the configured rate.

Memory stays bounded by the keys active lately: a bucket left idle long enough to refill
completely is the same as a new one, so it is dropped.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from ragservice.config import SecuritySettings

Clock = Callable[[], float]

ANSWER_COST = 4
"""Tokens an answer (`/v1/query`, `/v1/chat/completions`) costs: retrieval and an upstream call."""
EMBEDDING_TEXTS_PER_TOKEN = 16
"""`/v1/embeddings` costs a token per this many texts (or part of it)."""


def embedding_cost(texts: int) -> int:
    """Tokens an embeddings request of `texts` texts costs: 1 for up to 16, 2 up to 32, ..."""
    return max(1, math.ceil(texts / EMBEDDING_TEXTS_PER_TOKEN))


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """Token buckets by key; safe to call from many threads."""

    def __init__(self, *, per_second: float, burst: int, clock: Clock = time.monotonic) -> None:
        if per_second <= 0 or burst < 1:
            raise ValueError("a rate limit needs per_second > 0 and burst >= 1")
        self.per_second = per_second
        self.burst = burst
        self._clock = clock
        self._refill_seconds = burst / per_second  # an idle bucket is full again after this
        self._buckets: OrderedDict[Hashable, _Bucket] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, security: SecuritySettings) -> RateLimiter | None:
        """The configured limiter, or None when `RAGSERVICE_RATE_LIMIT_PER_SECOND` is 0."""
        if security.rate_limit_per_second == 0:
            return None
        return cls(per_second=security.rate_limit_per_second, burst=security.rate_limit_burst)

    def acquire(self, key: Hashable, cost: float = 1.0) -> float:
        """Take `cost` tokens for `key` (at most `burst`): 0.0 when the request may go ahead,
        else the seconds until the bucket has them again (nothing is taken then)."""
        cost = min(cost, float(self.burst))
        with self._lock:
            now = self._clock()
            self._evict_idle(now)
            bucket = self._refilled(key, now)
            if bucket.tokens >= cost:
                bucket.tokens -= cost
                return 0.0
            return (cost - bucket.tokens) / self.per_second

    def waiting(self, key: Hashable) -> float:
        """The seconds until `key`'s bucket has a token (0.0: it has one); takes nothing."""
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                return 0.0
            now = self._clock()
            tokens = min(
                float(self.burst), bucket.tokens + max(now - bucket.updated, 0) * self.per_second
            )
            return 0.0 if tokens >= 1 else (1 - tokens) / self.per_second

    def __len__(self) -> int:
        """Buckets held now (keys seen within the last refill time)."""
        return len(self._buckets)

    def _refilled(self, key: Hashable, now: float) -> _Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(tokens=float(self.burst), updated=now)
        else:
            gained = max(now - bucket.updated, 0.0) * self.per_second
            bucket.tokens = min(float(self.burst), bucket.tokens + gained)
            bucket.updated = now
            self._buckets.move_to_end(key)
        return bucket

    def _evict_idle(self, now: float) -> None:
        while self._buckets:
            key, oldest = next(iter(self._buckets.items()))
            if now - oldest.updated < self._refill_seconds:
                return
            del self._buckets[key]
