"""A typed client of the REST API, on httpx: search, answers (streamed), collections and
documents, ingest jobs.

```python
with RagserviceClient.connect("http://127.0.0.1:8000", api_key="rsk_...") as client:
    hits = client.search("impeller pumps", k=5)["results"]
    for event in client.ask("How do pumps move water?"):
        if isinstance(event, Token):
            print(event.text, end="")
```

Responses are the API's JSON documents, typed below (`docs/api.md` describes each field;
`NotRequired` ones are absent from the answers of older servers).
An error response raises the service's own exception for it (`ragservice.errors`: 404
`NotFoundError`, 409 `ConflictError`, 429 `RateLimitedError`, ...) with the server's `detail`
as its message; a server that cannot be reached raises `ServiceUnreachableError`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, NotRequired, TypedDict, cast
from urllib.parse import quote

import httpx

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
    ServiceUnreachableError,
    UnsupportedMediaTypeError,
    UpstreamError,
    UpstreamTimeoutError,
)

Mode = Literal["dense", "fulltext", "hybrid"]
JobStatus = Literal["queued", "running", "done", "failed"]


class DocumentRef(TypedDict):
    id: str
    external_id: str
    title: str | None


class SearchHit(TypedDict):
    chunk_id: str
    score: float
    text: str
    ordinal: int
    start_char: int
    end_char: int
    metadata: dict[str, Any]
    collection: str
    document: DocumentRef  # with the document's `metadata` too
    flagged: bool
    flag_reasons: list[str]
    pages: NotRequired[list[int] | None]  # of a paged document (a PDF): first to last


class SearchResponse(TypedDict):
    mode: Mode
    results: list[SearchHit]
    timings_ms: dict[str, float]
    embedding_model: dict[str, Any] | None


class Citation(TypedDict):
    number: int
    document: DocumentRef
    chunk_ids: list[str]
    start_char: int
    end_char: int
    pages: NotRequired[list[int] | None]  # of a paged document (a PDF): first to last
    cited_as: NotRequired[str]  # the source named for a reader: `Title (report.pdf, p. 12)`


class Source(Citation):
    text: str
    score: float
    flagged: bool


class QueryResponse(TypedDict):
    query_id: str
    answer: str
    citations: list[Citation]
    sources: list[Source]
    model: str
    status: str
    timings_ms: dict[str, float]
    cache: dict[str, Any] | None


class JobError(TypedDict):
    source: str | None
    error: str


class Job(TypedDict):
    id: str
    status: JobStatus
    kind: str
    collection_id: str | None
    counts: dict[str, int]
    errors: list[JobError]
    attempts: int
    created_at: str
    started_at: str | None
    finished_at: str | None


class Collection(TypedDict):
    id: str
    name: str
    description: str | None
    metadata: dict[str, Any]
    document_count: int
    chunk_count: int
    created_at: str


class DocumentChunk(TypedDict):
    id: str
    ordinal: int
    text: str
    start_char: int
    end_char: int
    pages: NotRequired[list[int] | None]  # of a paged document (a PDF): first to last
    metadata: dict[str, Any]


class DocumentDetail(TypedDict):
    id: str
    external_id: str
    title: str | None
    source: str | None
    metadata: dict[str, Any]
    chunk_count: int
    char_count: int
    chunks: list[DocumentChunk] | None  # in order; null unless asked for


@dataclass(frozen=True, slots=True)
class Token:
    """A piece of the answer, as generated."""

    text: str


@dataclass(frozen=True, slots=True)
class Citations:
    """After the last token: the sources the answer cites, and every source it was given."""

    citations: list[Citation]
    sources: list[Source]


@dataclass(frozen=True, slots=True)
class Done:
    """The end: the whole response, as `answer` returns it."""

    response: QueryResponse


AskEvent = Token | Citations | Done

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
    DatabaseUnavailableError,
    UpstreamTimeoutError,
)
_BY_KIND = {cls.__name__.removesuffix("Error"): cls for cls in _ERRORS}
_BY_STATUS = {cls.status_code: cls for cls in _ERRORS}


class RagserviceClient:
    """The REST API over one `httpx.Client` (its base URL, headers and transport); `connect`
    makes one. Close it when done (or use it as a context manager)."""

    def __init__(self, http: httpx.Client) -> None:
        self._http = http

    @classmethod
    def connect(
        cls,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> RagserviceClient:
        """A client of the server at `base_url`, sending `api_key` as a bearer token."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        return cls(
            httpx.Client(base_url=base_url, headers=headers, timeout=timeout, transport=transport)
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RagserviceClient:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- retrieval and answers -------------------------------------------------------------

    def search(
        self,
        query: str,
        *,
        collections: list[str] | None = None,
        mode: Mode = "hybrid",
        k: int = 10,
        filters: dict[str, Any] | None = None,
    ) -> SearchResponse:
        """`POST /v1/search`: the best `k` chunks, best first."""
        body = _without_none(query=query, collections=collections, mode=mode, k=k, filters=filters)
        return cast(SearchResponse, self._json("POST", "/v1/search", json=body))

    def answer(
        self,
        question: str,
        *,
        collections: list[str] | None = None,
        mode: Mode = "hybrid",
        k: int = 8,
        filters: dict[str, Any] | None = None,
        rerank: bool | None = None,
    ) -> QueryResponse:
        """`POST /v1/query`: the whole answer with its citations."""
        body = _query_body(question, collections, mode, k, filters, rerank)
        return cast(QueryResponse, self._json("POST", "/v1/query", json=body))

    def ask(
        self,
        question: str,
        *,
        collections: list[str] | None = None,
        mode: Mode = "hybrid",
        k: int = 8,
        filters: dict[str, Any] | None = None,
        rerank: bool | None = None,
    ) -> Iterator[AskEvent]:
        """`POST /v1/query` streamed: `Token`s as the answer is generated, then `Citations`,
        then `Done`. A failure after the first token raises, as one before it does."""
        body = {**_query_body(question, collections, mode, k, filters, rerank), "stream": True}
        try:
            with self._http.stream("POST", "/v1/query", json=body) as response:
                if not response.is_success:
                    response.read()
                    raise _error(response)
                yield from _ask_events(response)
        except httpx.TransportError as exc:
            raise _unreachable(self._http, exc) from exc

    # -- collections and documents ---------------------------------------------------------

    def collections(self) -> list[Collection]:
        """`GET /v1/collections`: the key's tenant's collections."""
        return cast(list[Collection], self._json("GET", "/v1/collections")["collections"])

    def document(self, collection: str, external_id: str, *, chunks: bool = True) -> DocumentDetail:
        """`GET /v1/collections/{collection}/documents/{external_id}`: one document, with its
        chunks in order (each a slice of the text: `start_char` to `end_char`)."""
        path = (
            f"/v1/collections/{quote(collection, safe='')}/documents/{quote(external_id, safe='')}"
        )
        params = {"chunks": "true" if chunks else "false"}
        return cast(DocumentDetail, self._json("GET", path, params=params))

    # -- ingest jobs -----------------------------------------------------------------------

    def jobs(
        self,
        *,
        collection: str | None = None,
        status: JobStatus | None = None,
        limit: int = 50,
    ) -> list[Job]:
        """`GET /v1/jobs`: the key's tenant's jobs, newest first."""
        params = _without_none(collection=collection, status=status, limit=limit)
        return cast(list[Job], self._json("GET", "/v1/jobs", params=params)["jobs"])

    def job(self, job_id: uuid.UUID | str) -> Job:
        """`GET /v1/jobs/{id}`: status, counts and per-file errors."""
        return cast(Job, self._json("GET", f"/v1/jobs/{job_id}"))

    def retry_job(self, job_id: uuid.UUID | str) -> Job:
        """`POST /v1/jobs/{id}/retry`: a failed job queued again (a writer key)."""
        return cast(Job, self._json("POST", f"/v1/jobs/{job_id}/retry"))

    # -- internals -------------------------------------------------------------------------

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise _unreachable(self._http, exc) from exc
        if not response.is_success:
            raise _error(response)
        return response.json()


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
) -> dict[str, Any]:
    return _without_none(
        question=question,
        collections=collections,
        mode=mode,
        k=k,
        filters=filters,
        rerank=rerank,
    )


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
