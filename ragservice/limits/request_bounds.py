"""The limits a request's content must keep that come from the settings (they are configured,
not fixed, so a field's schema cannot state them): the question's length and k, batch sizes,
`/v1/embeddings` inputs, chat histories, form fields' text. Each check raises the service's
error (422, or 413 for what is too large to take in one request)."""

from __future__ import annotations

from collections.abc import Sequence

from ragservice.config import LimitSettings
from ragservice.errors import InvalidInputError, PayloadTooLargeError
from ragservice.limits.text import text_problem


def check_form_text(value: str | None, field: str) -> str:
    """A form field's (or a file name's) text, or 422 naming the field when it holds a NUL
    character or a lone surrogate (as the JSON bodies' `Text` fields refuse them)."""
    if value is not None and (problem := text_problem(value)):
        raise InvalidInputError(f"{field}: {problem}")
    return value or ""


def check_text(text: str, limits: LimitSettings, *, field: str) -> None:
    """A question within `RAGSERVICE_MAX_QUERY_CHARS` that is more than white space."""
    if len(text) > limits.max_query_chars:
        raise InvalidInputError(
            f"{field}: {len(text)} characters; the limit is {limits.max_query_chars} "
            "(RAGSERVICE_MAX_QUERY_CHARS)"
        )
    if not text.strip():
        raise InvalidInputError(f"{field}: must contain more than white space")


def check_query(text: str, k: int, limits: LimitSettings, *, field: str) -> None:
    """The limits a request's text and k must keep (RAGSERVICE_MAX_QUERY_CHARS, MAX_K)."""
    check_text(text, limits, field=field)
    if k > limits.max_k:
        raise InvalidInputError(f"k: {k} is above the limit of {limits.max_k}")


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
