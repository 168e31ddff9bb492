"""Requests and responses on the wire: request bodies and paths, server-sent events, and the
service's error responses turned back into its exceptions."""

from __future__ import annotations

import json
import mimetypes
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import httpx

from ragservice.client.types import (
    AskEvent,
    Citations,
    Done,
    Mode,
    QueryResponse,
    Token,
    Upload,
)
from ragservice.errors import (
    AuthenticationError,
    BadRequestError,
    ConflictError,
    DatabaseUnavailableError,
    InvalidInputError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RagServiceError,
    RateLimitedError,
    ServiceStoppingError,
    ServiceUnreachableError,
    UnsupportedMediaTypeError,
    UpstreamError,
    UpstreamTimeoutError,
)

_ERRORS: tuple[type[RagServiceError], ...] = (
    BadRequestError,
    AuthenticationError,
    PermissionDeniedError,
    NotFoundError,
    ConflictError,
    PayloadTooLargeError,
    UnsupportedMediaTypeError,
    InvalidInputError,
    UpstreamError,
    ServiceStoppingError,  # before DatabaseUnavailableError: that one stands for a bare 503
    DatabaseUnavailableError,
    UpstreamTimeoutError,
)
_BY_KIND = {cls.__name__.removesuffix("Error"): cls for cls in _ERRORS}
_BY_STATUS = {cls.status_code: cls for cls in _ERRORS}


def _ask_events(response: httpx.Response) -> Iterator[AskEvent]:
    citations = Citations([], [])
    for name, data in _server_sent_events(response.iter_lines()):
        if name == "token":
            yield Token(data["text"])
        elif name == "citations":
            citations = Citations(data["citations"], data["sources"])
            yield citations
        elif name == "done":
            whole = {**data, "citations": citations.citations, "sources": citations.sources}
            yield Done(cast(QueryResponse, whole))
        elif name == "error":
            raise _error_of(data, response.status_code)


def _query_body(
    question: str,
    collections: list[str] | None,
    mode: Mode,
    k: int,
    filters: dict[str, Any] | None,
    rerank: bool | None,
    cache: bool | None,
    cache_refresh: bool | None,
    on_upstream_error: str | None,
) -> dict[str, Any]:
    return _without_none(
        question=question,
        collections=collections,
        mode=mode,
        k=k,
        filters=filters,
        rerank=rerank,
        cache=cache,
        cache_refresh=cache_refresh,
        on_upstream_error=on_upstream_error,
    )


def _segment(value: object) -> str:
    """`value` as one path segment: every reserved character escaped, dots too, so that an
    id such as `..` or `a/b?c` is never read as a path of its own."""
    return quote(str(value), safe="").replace(".", "%2E")


def _collection_path(name: str) -> str:
    return f"/v1/collections/{_segment(name)}"


def _document_path(collection: str, external_id: str) -> str:
    return f"{_collection_path(collection)}/documents/{_segment(external_id)}"


def _file_part(upload: Upload, opened: ExitStack) -> tuple[str, Any, str]:
    """The multipart part of one file: its base name, content (a path is streamed from its
    file) and content type (guessed from the name)."""
    if isinstance(upload, tuple):
        name, content = upload
        body: Any = content
    else:
        path = Path(upload)
        name, body = path.name, opened.enter_context(path.open("rb"))
    kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
    return name, body, kind


def _without_none(**fields: Any) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if value is not None}


def _server_sent_events(lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    """(event name, its JSON data) of each event of a `text/event-stream`."""
    name, data = "message", list[str]()
    for line in lines:
        if not line:
            if data:
                yield name, json.loads("\n".join(data))
            name, data = "message", []
        elif line.startswith("event:"):
            name = line.removeprefix("event:").strip()
        elif line.startswith("data:"):
            data.append(line.removeprefix("data:").removeprefix(" "))
    if data:
        yield name, json.loads("\n".join(data))


def _error(response: httpx.Response) -> RagServiceError:
    """The service's exception for an error response."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {"detail": response.text.strip() or response.reason_phrase}
    if response.status_code == 429:
        retry_after = float(response.headers.get("Retry-After", "1"))
        return RateLimitedError(str(body.get("detail", "")), retry_after=retry_after)
    return _error_of(body, response.status_code)


def _error_of(body: dict[str, Any], status: int) -> RagServiceError:
    detail = str(body.get("detail") or f"HTTP {status}")
    fields = [f"{e.get('field')}: {e.get('message')}" for e in body.get("errors") or []]
    if fields:
        detail = f"{detail} ({'; '.join(fields)})"
    cls = _BY_KIND.get(str(body.get("error")), _BY_STATUS.get(status, RagServiceError))
    return cls(detail)


def _unreachable(http: httpx.Client, exc: httpx.TransportError) -> ServiceUnreachableError:
    return ServiceUnreachableError(f"cannot reach {http.base_url}: {exc}")
