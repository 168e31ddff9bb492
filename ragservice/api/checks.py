"""Request checks more than one router makes: the limits from the settings that a field's
schema cannot state (they are configured, not fixed), each raising the service's error."""

from __future__ import annotations

from ragservice.config import Settings
from ragservice.errors import InvalidInputError, PayloadTooLargeError


def check_query(text: str, k: int, settings: Settings, *, field: str) -> None:
    """The limits a request's text and k must keep (RAGSERVICE_MAX_QUERY_CHARS, MAX_K)."""
    check_text(text, settings, field=field)
    if k > settings.max_k:
        raise InvalidInputError(f"k: {k} is above the limit of {settings.max_k}")


def check_text(text: str, settings: Settings, *, field: str) -> None:
    """A question within `RAGSERVICE_MAX_QUERY_CHARS` that is more than white space."""
    if len(text) > settings.max_query_chars:
        raise InvalidInputError(
            f"{field}: {len(text)} characters; the limit is {settings.max_query_chars} "
            "(RAGSERVICE_MAX_QUERY_CHARS)"
        )
    if not text.strip():
        raise InvalidInputError(f"{field}: must contain more than white space")


def check_batch(count: int, settings: Settings, *, field: str) -> None:
    """413 for a list of texts longer than `RAGSERVICE_MAX_BATCH_ITEMS`."""
    if count > settings.max_batch_items:
        raise PayloadTooLargeError(
            f"{field}: {count} items in one request; the limit is {settings.max_batch_items} "
            "(RAGSERVICE_MAX_BATCH_ITEMS); split them over several requests"
        )
