"""Request and response bodies of the REST API (they are the OpenAPI schema at /docs)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from ragservice.feedback.collect import MAX_FEEDBACK_CHARS, MAX_JUDGED_CHUNKS
from ragservice.limits import MAX_EXTERNAL_ID_BYTES, MAX_JSON_DEPTH, external_id_too_long, too_deep
from ragservice.retrieval.search import Mode

COLLECTION_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
MAX_TTL_SECONDS = 2**31 - 1  # the column is a PostgreSQL integer


def _shallow(value: dict[str, Any]) -> dict[str, Any]:
    # Checked before anything recurses into it: the store, the filter compiler, jsonb.
    if too_deep(value):
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def _storable_id(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    if external_id_too_long(value):
        raise ValueError(f"longer than {MAX_EXTERNAL_ID_BYTES} bytes in UTF-8")
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(_shallow)]
"""Metadata or a filter: a JSON object at most `MAX_JSON_DEPTH` levels deep."""

ExternalId = Annotated[str, AfterValidator(_storable_id)]
"""An opaque id: any text (`../etc/passwd` too: it never names a file), within a byte limit."""


class FieldErrorOut(BaseModel):
    field: str = Field(description="dotted path of the field in the request")
    message: str
    type: str


class ErrorOut(BaseModel):
    """The one shape of every error response."""

    error: str = Field(description="the kind of error, e.g. `InvalidInput`, `NotFound`")
    detail: str = Field(description="what went wrong, for a person to read")
    request_id: str = Field(description="quote it when reporting a problem")
    errors: list[FieldErrorOut] | None = Field(
        default=None, description="one entry per invalid field (validation errors only)"
    )


_ERROR_DESCRIPTIONS = {
    400: "malformed request (a body that is not JSON, a bad header)",
    401: "missing or unknown API key",
    403: "the key's role may not do this",
    404: "no such collection, document, job, answer or model",
    409: "conflicts with what exists",
    413: "body, file or batch over its limit",
    415: "a body or file of a type this operation does not take",
    422: "an invalid field",
    429: "over the key's rate limit; see Retry-After",
    502: "the inference layer failed",
    503: "the database is unavailable",
    504: "the inference layer did not answer in time",
}
COMMON_ERRORS = (400, 401, 403, 404, 413, 415, 422, 429, 503)


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the error statuses an operation may answer, all `ErrorOut`."""
    return {
        code: {"model": ErrorOut, "description": _ERROR_DESCRIPTIONS[code]}
        for code in sorted({*COMMON_ERRORS, *codes})
    }


class CollectionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=COLLECTION_NAME, description="letters, digits, . _ -; unique")
    description: str | None = Field(default=None, max_length=2000)
    metadata: JsonObject = Field(default_factory=dict)
    cache_ttl_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TTL_SECONDS,
        description="lifetime of cached answers; unset: the service default",
    )


class CollectionUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cache_ttl_seconds: int | None = Field(
        ge=1,
        le=MAX_TTL_SECONDS,
        description="lifetime of cached answers; null: the service default",
    )


class CacheStats(BaseModel):
    entries: int = Field(description="live (unexpired) entries covering the collection")
    bytes: int
    entry_hits: int = Field(description="hits served by the live entries")
    queries: int = Field(description="questions logged on the collection")
    cache_hits: int
    hit_rate: float


class CollectionOut(BaseModel):
    id: uuid.UUID
    name: str
    description: str | None
    metadata: dict[str, Any]
    document_count: int
    chunk_count: int
    cache_ttl_seconds: int | None
    created_at: datetime


class CollectionList(BaseModel):
    collections: list[CollectionOut]


class DocumentIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    external_id: ExternalId | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_EXTERNAL_ID_BYTES,
        description="your id for the document; unset: derived from the text, so a resend "
        "of the same text is a no-op",
    )
    title: str | None = Field(default=None, max_length=2000)
    text: str = Field(min_length=1)
    metadata: JsonObject = Field(default_factory=dict)


class DocumentsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[DocumentIn] = Field(min_length=1)


class DocumentOut(BaseModel):
    id: uuid.UUID
    external_id: str
    title: str | None
    source: str | None
    metadata: dict[str, Any]
    version: int
    chunk_count: int
    char_count: int
    created_at: datetime
    updated_at: datetime


class ChunkOut(BaseModel):
    id: uuid.UUID
    ordinal: int
    text: str
    token_count: int
    start_char: int
    end_char: int
    metadata: dict[str, Any]


class DocumentDetail(DocumentOut):
    chunks: list[ChunkOut] | None = None


class DocumentPage(BaseModel):
    documents: list[DocumentOut]
    next_after: str | None = Field(
        description="pass as `after` for the next page; null on the last page"
    )


class JobError(BaseModel):
    source: str | None = Field(description="the file or row; null for an error of the whole job")
    error: str


class JobOut(BaseModel):
    id: uuid.UUID
    status: str
    kind: str
    collection_id: uuid.UUID | None
    counts: dict[str, int]
    errors: list[JobError]
    attempts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class JobList(BaseModel):
    jobs: list[JobOut]


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1)
    collections: list[str] | None = Field(
        default=None, min_length=1, description="collection names; unset: all of yours"
    )
    mode: Mode = Mode.HYBRID
    k: int = Field(default=10, ge=1)
    filters: JsonObject | None = Field(
        default=None,
        description='metadata filters, e.g. {"year": {"$gte": 2020}, "chunk.heading": "Intro"}',
    )


class DocumentRef(BaseModel):
    id: uuid.UUID
    external_id: str
    title: str | None
    metadata: dict[str, Any]


class SearchHitOut(BaseModel):
    chunk_id: uuid.UUID
    score: float = Field(
        description="dense: cosine similarity; fulltext: BM25; hybrid: reciprocal rank fusion"
    )
    text: str
    ordinal: int
    start_char: int
    end_char: int
    metadata: dict[str, Any]
    collection: str
    document: DocumentRef


class EmbeddingModelOut(BaseModel):
    """The embedding model a search ran with (the one being served when it started)."""

    id: int
    name: str
    version: int


class SearchResponse(BaseModel):
    mode: Mode
    results: list[SearchHitOut]
    timings_ms: dict[str, float]
    embedding_model: EmbeddingModelOut | None = None


class QueryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1)
    collections: list[str] | None = Field(
        default=None, min_length=1, description="collection names; unset: all of yours"
    )
    mode: Mode = Mode.HYBRID
    k: int = Field(default=8, ge=1, description="chunks retrieved (after reranking) for context")
    filters: JsonObject | None = None
    rerank: bool | None = Field(
        default=None,
        description="rerank with the configured cross-encoder; unset: when there is one",
    )
    stream: bool = Field(default=False, description="server-sent events: tokens, then the answer")
    on_upstream_error: Literal["error", "extractive"] = Field(
        default="error",
        description="`extractive`: answer with the top passages when the inference layer fails",
    )
    cache: bool = Field(default=True, description="false: neither read nor write the cache")
    cache_refresh: bool = Field(
        default=False, description="answer afresh and replace the cached answer"
    )


class CacheOut(BaseModel):
    hit: bool
    kind: Literal["exact", "semantic"] | None = None
    similarity: float | None = None
    entry_id: uuid.UUID | None = None
    refused: str | None = Field(
        default=None, description="why the meaning guard turned a near match away"
    )


class DocumentRefLite(BaseModel):
    id: uuid.UUID
    external_id: str
    title: str | None


class CitationOut(BaseModel):
    number: int
    document: DocumentRefLite
    chunk_ids: list[uuid.UUID]
    start_char: int
    end_char: int


class SourceOut(BaseModel):
    number: int
    text: str
    score: float
    document: DocumentRefLite
    chunk_ids: list[uuid.UUID]
    start_char: int
    end_char: int


class QueryResponse(BaseModel):
    query_id: uuid.UUID = Field(description="refer to this answer (e.g. in feedback)")
    answer: str
    citations: list[CitationOut] = Field(description="the sources the answer cites")
    sources: list[SourceOut] = Field(description="every source handed to the model, numbered")
    model: str = Field(description="the upstream model, or `extractive`")
    status: str = Field(description="`ok` (generated) or `extractive`")
    timings_ms: dict[str, float]
    cache: CacheOut | None = Field(description="what the prompt cache did; null when not used")


class FeedbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rating: int | None = Field(
        default=None, description="thumbs: +1 or -1; stars: 1 to 5; null: no rating"
    )
    scale: Literal["thumbs", "stars"] = "thumbs"
    comment: str | None = Field(default=None, max_length=MAX_FEEDBACK_CHARS)
    corrected_answer: str | None = Field(
        default=None, max_length=MAX_FEEDBACK_CHARS, description="the answer it should have been"
    )
    relevant_chunk_ids: list[uuid.UUID] = Field(
        default_factory=list,
        max_length=MAX_JUDGED_CHUNKS,
        description="chunks that helped: retrieved for the answer or in its collections",
    )
    irrelevant_chunk_ids: list[uuid.UUID] = Field(
        default_factory=list, max_length=MAX_JUDGED_CHUNKS, description="chunks that did not"
    )


class FeedbackRequest(FeedbackBody):
    query_id: uuid.UUID = Field(description="the answer's `query_id`")


class FeedbackOut(BaseModel):
    id: uuid.UUID
    query_id: uuid.UUID
    rating: int | None
    scale: Literal["thumbs", "stars"]
    comment: str | None
    corrected_answer: str | None
    relevant_chunk_ids: list[uuid.UUID]
    irrelevant_chunk_ids: list[uuid.UUID]
    created_at: datetime
