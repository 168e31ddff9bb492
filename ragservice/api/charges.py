"""The rate-limit charge of a request beyond the one token authentication took: the requests
that cost more (`charge`), and any number of tokens with a refusal of the caller's (`spend`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from fastapi import Request

from ragservice.errors import RateLimitedError
from ragservice.limits.rate_limits import RateLimiter
from ragservice.metrics import Metrics


def charge(request: Request, key_id: uuid.UUID | None, cost: int, *, what: str) -> None:
    """Take the rest of a request's `cost` from its key's bucket (authentication took one
    token), or refuse with 429; a key that cannot be limited (no key) is not charged."""
    limiter: RateLimiter | None = request.app.state.rate_limiter
    if limiter is None:
        return
    whole = min(cost, limiter.burst)  # never more than a full bucket holds
    spend(
        request,
        key_id,
        whole - 1,
        lambda limits: (
            f"{what} costs {whole} rate-limit tokens; this API key is over its rate "
            f"limit of {limits.per_second:g} tokens per second (bursts of {limits.burst})"
        ),
    )


def spend(
    request: Request,
    key_id: uuid.UUID | None,
    tokens: int,
    refusal: Callable[[RateLimiter], str],
) -> None:
    """Take `tokens` from the key's bucket, or refuse with 429 saying `refusal(limiter)` and
    when to retry. Without a limiter or a key (authentication off) nothing is taken."""
    limiter: RateLimiter | None = request.app.state.rate_limiter
    if limiter is None or key_id is None or tokens <= 0:
        return
    wait = limiter.acquire(key_id, tokens)
    if wait > 0:
        metrics: Metrics = request.app.state.metrics
        metrics.rate_limited.inc()
        raise RateLimitedError(
            f"{refusal(limiter)}; retry after the seconds in Retry-After", retry_after=wait
        )
