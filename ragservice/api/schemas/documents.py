"""Documents: what an upload of JSON texts sends, and a document (with its chunks) as read."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from ragservice.api.schemas.common import DocumentText, JsonObject, Pages, Storable
from ragservice.db.models import Chunk, Document
from ragservice.errors import InvalidInputError
from ragservice.limits.shape import MAX_EXTERNAL_ID_BYTES, external_id_too_long
from ragservice.readers import MAX_READERS, parse_readers


def _storable_id(value: str) -> str:
    if external_id_too_long(value):
        raise ValueError(f"longer than {MAX_EXTERNAL_ID_BYTES} bytes in UTF-8")
    return value


ExternalId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_EXTERNAL_ID_BYTES),
    AfterValidator(_storable_id),
    Storable,
]
"""An opaque id: any text (`../etc/passwd` too: it never names a file), within a byte limit."""


def _checked_readers(value: list[str] | None) -> list[str] | None:
    try:
        readers = parse_readers(value)
    except InvalidInputError as exc:
        raise ValueError(str(exc)) from None
    return None if readers is None else list(readers)


Readers = Annotated[
    list[Annotated[str, StringConstraints(max_length=200)]] | None,
    Field(
        max_length=MAX_READERS,
        description="who may read the document: `user:<name>` and `group:<name>`; null or "
        "empty: the whole tenant (docs/permissions.md)",
        examples=[["group:hr", "user:ana"]],
    ),
    AfterValidator(_checked_readers),
]


class DocumentIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    external_id: ExternalId | None = Field(
        default=None,
        description="your id for the document; unset: derived from the text, so a resend "
        "of the same text is a no-op",
    )
    title: Annotated[str, StringConstraints(max_length=2000), Storable] | None = None
    text: DocumentText = Field(min_length=1)
    metadata: JsonObject = Field(default_factory=dict)
    readers: Readers = Field(
        default=None,
        description="who may read it (`user:<name>`, `group:<name>`); unset: a stored "
        "document keeps its readers, a new one is the whole tenant's",
    )


class DocumentsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[DocumentIn] = Field(min_length=1)


class ReadersIn(BaseModel):
    """New readers for a document."""

    model_config = ConfigDict(extra="forbid")

    readers: Readers


class DocumentOut(BaseModel):
    id: uuid.UUID
    external_id: str
    title: str | None
    source: str | None
    metadata: dict[str, Any]
    readers: list[str] | None = Field(description="who may read it; null: the whole tenant")
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
    pages: Pages = None
    metadata: dict[str, Any]


class DocumentDetail(DocumentOut):
    chunks: list[ChunkOut] | None = None


class DocumentPage(BaseModel):
    documents: list[DocumentOut]
    next_after: str | None = Field(
        description="pass as `after` for the next page; null on the last page"
    )


def document_out(doc: Document) -> DocumentOut:
    return DocumentOut(
        id=doc.id,
        external_id=doc.external_id,
        title=doc.title,
        source=doc.source,
        metadata=doc.metadata_,
        readers=doc.readers,
        version=doc.version,
        chunk_count=doc.chunk_count,
        char_count=doc.char_count,
        created_at=doc.created_at,
        updated_at=doc.updated_at,
    )


def document_detail(doc: Document, chunks: Sequence[Chunk] | None) -> DocumentDetail:
    """The document, with its chunks in order when they were asked for (else `chunks` null)."""
    return DocumentDetail(
        **document_out(doc).model_dump(),
        chunks=None if chunks is None else [_chunk_out(chunk) for chunk in chunks],
    )


def _chunk_out(chunk: Chunk) -> ChunkOut:
    return ChunkOut(
        id=chunk.id,
        ordinal=chunk.ordinal,
        text=chunk.text,
        token_count=chunk.token_count,
        start_char=chunk.start_char,
        end_char=chunk.end_char,
        pages=_pages(chunk),
        metadata=chunk.metadata_,
    )


def _pages(chunk: Chunk) -> list[int] | None:
    if chunk.page_start is None or chunk.page_end is None:
        return None
    return list(range(chunk.page_start, chunk.page_end + 1))
