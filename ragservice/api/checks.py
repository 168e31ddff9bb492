"""Request checks more than one router makes: the limits from the settings that a field's
schema cannot state (they are configured, not fixed), each raising the service's error; and
the rate-limit charge of the requests that cost more than one token."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence

from fastapi import Request

from ragservice.auth.ratelimit import RateLimiter
from ragservice.config import LimitSettings
from ragservice.errors import InvalidInputError, PayloadTooLargeError, RateLimitedError
from ragservice.limits import text_problem
from ragservice.metrics import Metrics


def check_form_text(value: str | None, field: str) -> str:
    """A form field's (or a file name's) text, or 422 naming the field when it holds a NUL
    character or a lone surrogate (as the JSON bodies' `Text` fields refuse them)."""
    if value is not None and (problem := text_problem(value)):
        raise InvalidInputError(f"{field}: {problem}")
    return value or ""


def check_batch(count: int, limits: LimitSettings, *, field: str) -> None:
    """413 for a list of texts longer than `RAGSERVICE_MAX_BATCH_ITEMS`."""
    if count > limits.max_batch_items:
        raise PayloadTooLargeError(
            f"{field}: {count} items in one request; the limit is {limits.max_batch_items} "
            "(RAGSERVICE_MAX_BATCH_ITEMS); split them over several requests"
        )


def check_embedding_texts(texts: Sequence[str], limits: LimitSettings) -> None:
    """`/v1/embeddings` input within RAGSERVICE_MAX_EMBEDDING_INPUTS (413), ..._INPUT_CHARS
    for each text (422) and ..._REQUEST_CHARS for them all (413)."""
    check_embedding_count(len(texts), limits)
    for i, text in enumerate(texts):
        if len(text) > limits.max_embedding_input_chars:
            raise InvalidInputError(
                f"input[{i}]: {len(text)} characters; the limit is "
                f"{limits.max_embedding_input_chars} (RAGSERVICE_MAX_EMBEDDING_INPUT_CHARS)"
            )
    total = sum(len(text) for text in texts)
    if total > limits.max_embedding_request_chars:
        raise PayloadTooLargeError(
            f"input: {total} characters in one request; the limit is "
            f"{limits.max_embedding_request_chars} (RAGSERVICE_MAX_EMBEDDING_REQUEST_CHARS); "
            "split them over several requests"
        )


def check_embedding_count(count: int, limits: LimitSettings, *, noun: str = "texts") -> None:
    """413 for more `/v1/embeddings` inputs (`noun`: texts or token arrays) than
    RAGSERVICE_MAX_EMBEDDING_INPUTS."""
    if count > limits.max_embedding_inputs:
        raise PayloadTooLargeError(
            f"input: {count} {noun} in one request; the limit is "
            f"{limits.max_embedding_inputs} (RAGSERVICE_MAX_EMBEDDING_INPUTS); "
            "split them over several requests"
        )


def check_chat(messages: int, chars: int, max_tokens: int | None, limits: LimitSettings) -> None:
    """A chat request within RAGSERVICE_MAX_CHAT_MESSAGES, MAX_CHAT_CHARS (what is forwarded
    upstream: the history and the question) and MAX_ANSWER_TOKENS."""
    if messages > limits.max_chat_messages:
        raise InvalidInputError(
            f"messages: {messages} in one request; the limit is {limits.max_chat_messages} "
            "(RAGSERVICE_MAX_CHAT_MESSAGES)"
        )
    if chars > limits.max_chat_chars:
        raise InvalidInputError(
            f"messages: {chars} characters of conversation; the limit is "
            f"{limits.max_chat_chars} (RAGSERVICE_MAX_CHAT_CHARS)"
        )
    if max_tokens is not None and max_tokens > limits.max_answer_tokens:
        raise InvalidInputError(
            f"max_tokens: {max_tokens} is above the limit of {limits.max_answer_tokens} "
            "(RAGSERVICE_MAX_ANSWER_TOKENS)"
        )


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
