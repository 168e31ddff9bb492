"""The REST API's JSON documents as typed dictionaries, and the events of a streamed answer."""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, Literal, NotRequired, TypedDict

from ragservice.types import JobStatus as JobStatus  # the client's name for it too

Mode = Literal["dense", "fulltext", "hybrid"]
FlaggedChunks = Literal["mark", "downweight", "drop"]
Scale = Literal["thumbs", "stars"]
ExportFormat = Literal["openai-sft", "openai-dpo", "trl-dpo", "triplets"]

URL_VARIABLE: Final = "RAGSERVICE_URL"
API_KEY_VARIABLE: Final = "RAGSERVICE_API_KEY"
DEFAULT_URL: Final = "http://127.0.0.1:8000"


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
    cache_ttl_seconds: int | None  # null: the service default
    flagged_chunks: FlaggedChunks
    created_at: str


class CacheStats(TypedDict):
    entries: int
    bytes: int
    entry_hits: int
    queries: int
    cache_hits: int
    hit_rate: float


class DocumentIn(TypedDict):
    """A JSON text to ingest; without `external_id` the service derives one from the text."""

    text: str
    external_id: NotRequired[str]
    title: NotRequired[str | None]
    metadata: NotRequired[dict[str, Any]]


class Document(TypedDict):
    id: str
    external_id: str
    title: str | None
    source: str | None
    metadata: dict[str, Any]
    version: int
    chunk_count: int
    char_count: int
    created_at: str
    updated_at: str


class Chunk(TypedDict):
    id: str
    ordinal: int
    text: str
    token_count: int
    start_char: int
    end_char: int
    pages: list[int] | None
    metadata: dict[str, Any]


class DocumentDetail(Document):
    chunks: list[Chunk] | None  # null unless asked for


class DocumentPage(TypedDict):
    documents: list[Document]
    next_after: str | None  # pass as `after` for the next page; null on the last


class Feedback(TypedDict):
    id: str
    query_id: str
    rating: int | None
    scale: Scale
    comment: str | None
    corrected_answer: str | None
    relevant_chunk_ids: list[str]
    irrelevant_chunk_ids: list[str]
    created_at: str


class AuditEntry(TypedDict):
    id: int
    at: str
    actor: str
    key_id: str | None
    action: str
    target: str
    details: dict[str, Any]


class AuditPage(TypedDict):
    entries: list[AuditEntry]
    next_before: int | None  # pass as `before` for the next (older) page; null on the last


class Me(TypedDict):
    tenant: dict[str, str]  # `id` and `name`
    role: str  # reader, writer or admin
    auth_disabled: bool
    service_admin: bool
    key_prefix: str | None
    max_file_bytes: int
    max_files_per_upload: int
    cache_enabled: bool
    answer_model: str


class Health(TypedDict):
    ready: bool
    checks: dict[str, bool]
    model: dict[str, Any]
    nodes: NotRequired[list[dict[str, Any]]]  # with read replicas


Upload = str | os.PathLike[str] | tuple[str, bytes]
"""A file to upload: a path, or (file name, content) of one held in memory."""


class _Keep(Enum):
    KEEP = "keep"


KEEP: Final = _Keep.KEEP
"""`update_collection`'s default: leave the setting as it is."""


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
