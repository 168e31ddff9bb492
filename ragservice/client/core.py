"""`RagserviceClient`: the REST API over one `httpx.Client`."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, cast

import httpx

from ragservice.client.types import (
    API_KEY_VARIABLE,
    DEFAULT_URL,
    KEEP,
    URL_VARIABLE,
    AskEvent,
    AuditPage,
    CacheStats,
    Collection,
    Document,
    DocumentDetail,
    DocumentIn,
    DocumentPage,
    ExportFormat,
    Feedback,
    FlaggedChunks,
    Health,
    Job,
    JobStatus,
    Me,
    Mode,
    QueryResponse,
    Scale,
    SearchResponse,
    Upload,
    _Keep,
)
from ragservice.client.wire import (
    _ask_events,
    _collection_path,
    _document_path,
    _error,
    _file_part,
    _query_body,
    _segment,
    _unreachable,
    _without_none,
)
from ragservice.limits.results import ANSWER_K, SEARCH_K
from ragservice.types import FINISHED_JOB_STATUSES


class RagserviceClient:
    """The REST API over one `httpx.Client` (its base URL, headers, timeout and transport,
    and its pool of kept-alive connections); `connect` or `from_env` makes one. Close it
    when done (or use it as a context manager). A client may be shared by threads, as its
    `httpx.Client` may."""

    def __init__(self, http: httpx.Client) -> None:
        self._http = http

    @classmethod
    def connect(
        cls,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 60.0,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> RagserviceClient:
        """A client of the server at `base_url`, sending `api_key` as a bearer token and
        `headers` with every request (e.g. an `X-Request-ID` to find in the server's logs).
        `transport`: httpx's, e.g. `httpx.HTTPTransport(retries=2)` or a `MockTransport`."""
        sent = {**(headers or {})}
        if api_key:
            sent["Authorization"] = f"Bearer {api_key}"
        return cls(
            httpx.Client(base_url=base_url, headers=sent, timeout=timeout, transport=transport)
        )

    @classmethod
    def from_env(
        cls,
        *,
        timeout: float | httpx.Timeout = 60.0,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> RagserviceClient:
        """A client of `RAGSERVICE_URL` (default http://127.0.0.1:8000) with the key in
        `RAGSERVICE_API_KEY`, if set."""
        return cls.connect(
            os.environ.get(URL_VARIABLE) or DEFAULT_URL,
            api_key=os.environ.get(API_KEY_VARIABLE) or None,
            timeout=timeout,
            headers=headers,
            transport=transport,
        )

    @property
    def http(self) -> httpx.Client:
        """The `httpx.Client` underneath, for a request this client has no method for."""
        return self._http

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
        k: int = SEARCH_K,
        filters: dict[str, Any] | None = None,
        group_by: Literal["chunk", "document"] | None = None,
        ranking: dict[str, Any] | None = None,
    ) -> SearchResponse:
        """`POST /v1/search`: the best `k` chunks (or documents: `group_by="document"`), best
        first; `ranking` overrides the server's ranking settings for this search."""
        body = _without_none(
            query=query,
            collections=collections,
            mode=mode,
            k=k,
            filters=filters,
            group_by=group_by,
            ranking=ranking,
        )
        return cast(SearchResponse, self._json("POST", "/v1/search", json=body))

    def answer(
        self,
        question: str,
        *,
        collections: list[str] | None = None,
        mode: Mode = "hybrid",
        k: int = ANSWER_K,
        filters: dict[str, Any] | None = None,
        rerank: bool | None = None,
        cache: bool | None = None,
        cache_refresh: bool | None = None,
        on_upstream_error: Literal["error", "extractive"] | None = None,
    ) -> QueryResponse:
        """`POST /v1/query`: the whole answer with its citations. `cache=False`: the prompt
        cache is neither read nor written; `cache_refresh=True`: answered anew and stored."""
        body = _query_body(
            question, collections, mode, k, filters, rerank, cache, cache_refresh, on_upstream_error
        )
        return cast(QueryResponse, self._json("POST", "/v1/query", json=body))

    def ask(
        self,
        question: str,
        *,
        collections: list[str] | None = None,
        mode: Mode = "hybrid",
        k: int = ANSWER_K,
        filters: dict[str, Any] | None = None,
        rerank: bool | None = None,
        cache: bool | None = None,
        cache_refresh: bool | None = None,
        on_upstream_error: Literal["error", "extractive"] | None = None,
    ) -> Iterator[AskEvent]:
        """`POST /v1/query` streamed: `Token`s as the answer is generated, then `Citations`,
        then `Done`. A failure after the first token raises, as one before it does."""
        body = _query_body(
            question, collections, mode, k, filters, rerank, cache, cache_refresh, on_upstream_error
        )
        with self._stream("POST", "/v1/query", json={**body, "stream": True}) as response:
            yield from _ask_events(response)

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
        return cast(Job, self._json("GET", f"/v1/jobs/{_segment(job_id)}"))

    def retry_job(self, job_id: uuid.UUID | str) -> Job:
        """`POST /v1/jobs/{id}/retry`: a failed job queued again (a writer key)."""
        return cast(Job, self._json("POST", f"/v1/jobs/{_segment(job_id)}/retry"))

    def wait_job(
        self,
        job_id: uuid.UUID | str,
        *,
        until: Iterable[JobStatus] = FINISHED_JOB_STATUSES,
        timeout: float = 600.0,
        interval: float = 0.5,
        on_poll: Callable[[Job], None] | None = None,
    ) -> Job:
        """The job once its status is one of `until` (by default: once it has ended, done or
        failed: look at its `status` and `errors`), polled every `interval` seconds;
        `on_poll` sees every state polled. `TimeoutError` after `timeout` seconds."""
        wanted = set(until)
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if on_poll is not None:
                on_poll(job)
            if job["status"] in wanted:
                return job
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} is still {job['status']} after {timeout:g} s")
            time.sleep(interval)

    # -- collections and documents ---------------------------------------------------------

    def collections(self) -> list[Collection]:
        """`GET /v1/collections`: the key's tenant's collections with their counts."""
        return cast(list[Collection], self._json("GET", "/v1/collections")["collections"])

    def collection(self, name: str) -> Collection:
        """`GET /v1/collections/{name}`."""
        return cast(Collection, self._json("GET", _collection_path(name)))

    def create_collection(
        self,
        name: str,
        *,
        description: str | None = None,
        metadata: dict[str, Any] | None = None,
        cache_ttl_seconds: int | None = None,
        flagged_chunks: FlaggedChunks | None = None,
    ) -> Collection:
        """`POST /v1/collections` (a writer key); `ConflictError` when the name is taken."""
        body = _without_none(
            name=name,
            description=description,
            metadata=metadata,
            cache_ttl_seconds=cache_ttl_seconds,
            flagged_chunks=flagged_chunks,
        )
        return cast(Collection, self._json("POST", "/v1/collections", json=body))

    def update_collection(
        self,
        name: str,
        *,
        cache_ttl_seconds: int | _Keep | None = KEEP,
        flagged_chunks: FlaggedChunks | None = None,
    ) -> Collection:
        """`PATCH /v1/collections/{name}` (an admin key): the cached answers' lifetime
        (`None`: the service default) and what search does with flagged chunks; what is
        not given stays as it is."""
        body = _without_none(flagged_chunks=flagged_chunks)
        if cache_ttl_seconds is not KEEP:
            body["cache_ttl_seconds"] = cache_ttl_seconds
        return cast(Collection, self._json("PATCH", _collection_path(name), json=body))

    def delete_collection(self, name: str) -> None:
        """`DELETE /v1/collections/{name}` (an admin key): with all its documents and jobs."""
        self._send("DELETE", _collection_path(name))

    def cache_stats(self, name: str) -> CacheStats:
        """`GET /v1/collections/{name}/cache` (an admin key): the prompt cache's entries,
        size and hit rate for the collection."""
        return cast(CacheStats, self._json("GET", f"{_collection_path(name)}/cache"))

    def purge_cache(self, name: str) -> int:
        """`DELETE /v1/collections/{name}/cache` (an admin key): the entries deleted."""
        return int(self._json("DELETE", f"{_collection_path(name)}/cache")["purged"])

    def documents(
        self, collection: str, *, limit: int = 100, after: str | None = None
    ) -> DocumentPage:
        """`GET /v1/collections/{name}/documents`: a page of documents ordered by external
        id; the next page is `after=page["next_after"]` (null on the last page)."""
        params = _without_none(limit=limit, after=after)
        path = f"{_collection_path(collection)}/documents"
        return cast(DocumentPage, self._json("GET", path, params=params))

    def iter_documents(self, collection: str, *, page_size: int = 100) -> Iterator[Document]:
        """Every document of the collection, ordered by external id, a page at a time."""
        after: str | None = None
        while True:
            page = self.documents(collection, limit=page_size, after=after)
            yield from page["documents"]
            after = page["next_after"]
            if after is None:
                return

    def document(self, collection: str, document_id: str, *, chunks: bool = True) -> DocumentDetail:
        """`GET /v1/collections/{name}/documents/{external_id}`: the document by its external
        id, with its chunks in order (`chunks=False`: without, `chunks` null)."""
        path = _document_path(collection, document_id)
        return cast(DocumentDetail, self._json("GET", path, params={"chunks": chunks}))

    def add_documents(self, collection: str, documents: Iterable[DocumentIn]) -> Job:
        """`POST /v1/collections/{name}/documents` (a writer key): JSON texts queued as one
        ingest job; `wait_job` waits for it."""
        body = {"documents": list(documents)}
        return cast(Job, self._json("POST", f"{_collection_path(collection)}/documents", json=body))

    def upload_files(
        self,
        collection: str,
        files: Iterable[Upload],
        *,
        metadata: dict[str, Any] | None = None,
        jsonl_fields: str | None = None,
        parquet_columns: str | None = None,
        model: str | None = None,
    ) -> Job:
        """`POST /v1/collections/{name}/documents/files` (a writer key): files (paths, or
        (name, content) pairs) uploaded as one multipart request, queued as one ingest job.
        `metadata` is added to every document; `jsonl_fields`, `parquet_columns` and `model`
        are the form fields of the same names (`docs/api.md`)."""
        form = _without_none(
            metadata=None if metadata is None else json.dumps(metadata),
            jsonl_fields=jsonl_fields,
            parquet_columns=parquet_columns,
            model=model,
        )
        path = f"{_collection_path(collection)}/documents/files"
        with ExitStack() as opened:
            parts = [("files", _file_part(each, opened)) for each in files]
            return cast(Job, self._json("POST", path, files=parts, data=form))

    def delete_document(self, collection: str, document_id: str) -> None:
        """`DELETE /v1/collections/{name}/documents/{external_id}` (a writer key)."""
        self._send("DELETE", _document_path(collection, document_id))

    # -- feedback --------------------------------------------------------------------------

    def feedback(
        self,
        query_id: uuid.UUID | str,
        *,
        rating: int | None = None,
        scale: Scale | None = None,
        comment: str | None = None,
        corrected_answer: str | None = None,
        relevant_chunk_ids: Iterable[uuid.UUID | str] = (),
        irrelevant_chunk_ids: Iterable[uuid.UUID | str] = (),
    ) -> Feedback:
        """`POST /v1/feedback` on an answer (its `query_id`): a rating (thumbs +1/-1 or, with
        `scale="stars"`, 1 to 5), a comment, a corrected answer, chunks relevant or not."""
        body = _without_none(
            query_id=str(query_id),
            rating=rating,
            scale=scale,
            comment=comment,
            corrected_answer=corrected_answer,
        )
        body["relevant_chunk_ids"] = [str(each) for each in relevant_chunk_ids]
        body["irrelevant_chunk_ids"] = [str(each) for each in irrelevant_chunk_ids]
        return cast(Feedback, self._json("POST", "/v1/feedback", json=body))

    def export_feedback(
        self,
        fmt: ExportFormat,
        *,
        collection: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        time_of: Literal["feedback", "query"] | None = None,
        min_rating: int | None = None,
        max_rating: int | None = None,
        negatives_per_positive: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """`GET /v1/feedback/export` (an admin key): the tenant's feedback as fine-tuning
        records, one per NDJSON line, read as they stream."""
        params = _without_none(
            format=fmt,
            collection=collection,
            since=None if since is None else since.isoformat(),
            until=None if until is None else until.isoformat(),
            time_of=time_of,
            min_rating=min_rating,
            max_rating=max_rating,
            negatives_per_positive=negatives_per_positive,
        )
        with self._stream("GET", "/v1/feedback/export", params=params) as response:
            for line in response.iter_lines():
                if line.strip():
                    yield json.loads(line)

    # -- administration --------------------------------------------------------------------

    def audit(self, *, limit: int = 100, before: int | None = None) -> AuditPage:
        """`GET /v1/audit` (an admin key): the tenant's audit log, newest first; the next
        page is `before=page["next_before"]`."""
        params = _without_none(limit=limit, before=before)
        return cast(AuditPage, self._json("GET", "/v1/audit", params=params))

    def me(self) -> Me:
        """`GET /v1/me`: the key's tenant and role and the server's limits (any valid key; a
        wrong, expired or revoked one raises `AuthenticationError`)."""
        return cast(Me, self._json("GET", "/v1/me"))

    def health(self) -> Health:
        """`GET /v1/admin/health` (an admin key): readiness in detail. A server that is not
        ready answers too (`ready` false), not an error."""
        response = self._send("GET", "/v1/admin/health", accept=(503,))
        return cast(Health, response.json())

    # -- internals -------------------------------------------------------------------------

    def _send(
        self, method: str, path: str, *, accept: tuple[int, ...] = (), **kwargs: Any
    ) -> httpx.Response:
        """The response to one request; an error response (but those in `accept`) raises."""
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise _unreachable(self._http, exc) from exc
        if not response.is_success and response.status_code not in accept:
            raise _error(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._send(method, path, **kwargs).json()

    @contextmanager
    def _stream(self, method: str, path: str, **kwargs: Any) -> Iterator[httpx.Response]:
        """A streamed response, read within; an error response raises before."""
        try:
            with self._http.stream(method, path, **kwargs) as response:
                if not response.is_success:
                    response.read()
                    raise _error(response)
                yield response
        except httpx.TransportError as exc:
            raise _unreachable(self._http, exc) from exc
