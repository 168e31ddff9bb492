"""Documents, their chunks and embeddings: idempotent batch writes and reads."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import sql
from sqlalchemy import delete, func, select
from sqlalchemy import text as sql_text
from sqlalchemy.orm import Session

from ragservice.db import tenancy
from ragservice.db.engine import driver_connection
from ragservice.db.models import Chunk, Document
from ragservice.store import bulk, indexes, postings
from ragservice.types import TextChunk

_CHUNK_COLUMNS = (
    "id",
    "tenant_id",
    "collection_id",
    "document_id",
    "ordinal",
    "text",
    "token_count",
    "content_hash",
    "start_char",
    "end_char",
    "metadata",
    "page_start",
    "page_end",
    "readers",
)
_CHUNK_TYPES = (
    "uuid",
    "uuid",
    "uuid",
    "uuid",
    "int4",
    "text",
    "int4",
    "text",
    "int4",
    "int4",
    "jsonb",
    "int4",
    "int4",
    "text[]",
)

# Who writes is written into the statement as literals: a Citus coordinator runs an INSERT ...
# SELECT by sending the conflict clause on to the workers, where its parameters have no type.
_UPSERT_DOCUMENTS = """
INSERT INTO documents AS d (tenant_id, collection_id, external_id, title, source, metadata,
                            content_hash, chunk_count, char_count, readers)
SELECT %(tenant_id)s::uuid, %(collection_id)s::uuid, u.external_id, u.title, u.source,
       u.metadata::jsonb,
       u.content_hash, u.chunk_count, u.char_count,
       string_to_array(nullif(u.readers, ''), ',')
FROM unnest(%(external_ids)s::text[], %(titles)s::text[], %(sources)s::text[],
            %(metadata)s::text[], %(hashes)s::text[], %(chunk_counts)s::int[],
            %(char_counts)s::int[], %(readers)s::text[])
     AS u(external_id, title, source, metadata, content_hash, chunk_count, char_count, readers)
ON CONFLICT (collection_id, external_id, tenant_id) DO UPDATE
SET title = EXCLUDED.title, source = EXCLUDED.source, metadata = EXCLUDED.metadata,
    content_hash = EXCLUDED.content_hash, chunk_count = EXCLUDED.chunk_count,
    char_count = EXCLUDED.char_count, readers = EXCLUDED.readers, version = d.version + 1,
    updated_at = EXCLUDED.updated_at
WHERE d.content_hash IS DISTINCT FROM EXCLUDED.content_hash
  AND ({writes_all} OR d.readers IS NULL OR cardinality(d.readers) = 0
       OR d.readers && {writes_as}::text[])
RETURNING d.id, d.external_id, d.version, d.readers
"""

# A document's readers changed (PATCH). Its chunks follow and the cached answers built on it go,
# by the documents' trigger (migration 0026), whatever path the change takes. It runs reading
# every document of the tenant (the caller found the document first), so that new readers may
# leave the caller out; the caller's principal set is put back after it.
_SET_READERS = """
UPDATE documents SET readers = %(readers)s::text[], updated_at = now()
WHERE id = %(document_id)s AND readers IS DISTINCT FROM %(readers)s::text[]
"""


@dataclass(frozen=True, slots=True)
class DocumentWrite:
    """A parsed, chunked and embedded document, ready to be written in one batch."""

    external_id: str
    title: str | None
    source: str
    metadata: dict[str, Any]
    content_hash: str
    char_count: int
    chunks: Sequence[TextChunk]
    chunk_hashes: Sequence[str]
    embeddings: npt.NDArray[np.float32]
    readers: Sequence[str] | None = None
    """Who may read it (`user:…`, `group:…`); None or empty: the whole tenant."""


@dataclass(frozen=True, slots=True)
class WrittenDocument:
    id: uuid.UUID
    external_id: str
    version: int
    readers: list[str] | None = None


@dataclass(frozen=True, slots=True)
class StoredDocument:
    """What an ingest needs to know of a stored document: its hash and its readers."""

    content_hash: str
    readers: list[str] | None


@dataclass(slots=True)
class BatchWriteResult:
    written: list[WrittenDocument] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    chunks: int = 0


def stored_documents(
    session: Session, collection_id: uuid.UUID, external_ids: Sequence[str]
) -> dict[str, StoredDocument]:
    """external_id → content hash and readers of the given documents already stored."""
    stmt = select(Document.external_id, Document.content_hash, Document.readers).where(
        Document.collection_id == collection_id, Document.external_id.in_(external_ids)
    )
    return {row[0]: StoredDocument(row[1], row[2]) for row in session.execute(stmt)}


def set_readers(session: Session, document_id: uuid.UUID, readers: Sequence[str] | None) -> bool:
    """Give a document (and its chunks) new readers, None or empty: the whole tenant; whether
    they changed. Nothing is re-embedded; the cached answers built on it are deleted. The
    caller must have found the document (it may read it): the new readers may leave it out."""
    params = {"document_id": document_id, "readers": list(readers) if readers else None}
    conn = driver_connection(session)
    with tenancy.reading_every_document(conn):
        return bool(conn.execute(_SET_READERS, params).rowcount)


def delete_documents(
    session: Session, collection_id: uuid.UUID, external_ids: Sequence[str]
) -> int:
    """Delete documents by external id; their chunks and embeddings go with them (cascade)."""
    stmt = delete(Document).where(
        Document.collection_id == collection_id, Document.external_id.in_(external_ids)
    )
    return int(session.execute(stmt).rowcount)  # type: ignore[attr-defined]


def delete_documents_except(
    session: Session, collection_id: uuid.UUID, keep: Iterable[str]
) -> list[str]:
    """Delete every document of the collection whose external id is not in `keep`."""
    stmt = (
        delete(Document)
        .where(
            Document.collection_id == collection_id,
            Document.external_id.not_in(list(keep)),
        )
        .returning(Document.external_id)
    )
    return sorted(session.scalars(stmt))


def write_documents(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    collection_id: uuid.UUID,
    model_id: int,
    documents: Sequence[DocumentWrite],
    append: bool | None = None,
    writes_as: frozenset[str] | None = None,
) -> BatchWriteResult:
    """Insert new documents and replace changed ones with their chunks and embeddings.

    A document whose stored hash already matches (another writer got there first) is left
    alone. Old chunks of a changed document are deleted (their embeddings cascade) and the
    document's version goes up by one. `append` (default: for a batch of at least
    `postings.APPEND_MIN_CHUNKS` chunks) writes the postings in append mode, for a load that
    ends with `postings.pack_postings`. `writes_as`: a stored document that this principal set
    may not read is left alone, like an unchanged one (None: every document may be replaced);
    the ingest refuses those before it gets here, this holds when one turns hidden meanwhile.
    """
    if append is None:
        append = sum(len(d.chunks) for d in documents) >= postings.APPEND_MIN_CHUNKS
    if append:
        postings.append_postings(session)
    conn = driver_connection(session)
    written = _upsert_documents(conn, tenant_id, collection_id, documents, writes_as)
    result = BatchWriteResult(written=written)
    by_external = {doc.external_id: doc for doc in documents}
    result.unchanged = sorted(set(by_external) - {w.external_id for w in written})
    replaced = [w.id for w in written if w.version > 1]
    if replaced:
        conn.execute("DELETE FROM chunks WHERE document_id = ANY(%s)", (replaced,))
    result.chunks = _copy_chunks(conn, tenant_id, collection_id, model_id, written, by_external)
    return result


def _upsert_documents(
    conn: psycopg.Connection[Any],
    tenant_id: uuid.UUID,
    collection_id: uuid.UUID,
    documents: Sequence[DocumentWrite],
    writes_as: frozenset[str] | None,
) -> list[WrittenDocument]:
    params = {
        "tenant_id": tenant_id,
        "collection_id": collection_id,
        "external_ids": [d.external_id for d in documents],
        "titles": [d.title for d in documents],
        "sources": [d.source for d in documents],
        "metadata": [json.dumps(d.metadata, ensure_ascii=False) for d in documents],
        "hashes": [d.content_hash for d in documents],
        "chunk_counts": [len(d.chunks) for d in documents],
        "char_counts": [d.char_count for d in documents],
        "readers": [",".join(d.readers or ()) for d in documents],
    }
    statement = sql.SQL(_UPSERT_DOCUMENTS).format(
        writes_all=sql.Literal(writes_as is None),
        writes_as=sql.Literal(sorted(writes_as or ())),
    )
    rows = conn.execute(statement, params).fetchall()
    return [
        WrittenDocument(id=row[0], external_id=row[1], version=row[2], readers=row[3])
        for row in rows
    ]


def _copy_chunks(
    conn: psycopg.Connection[Any],
    tenant_id: uuid.UUID,
    collection_id: uuid.UUID,
    model_id: int,
    written: Sequence[WrittenDocument],
    by_external: dict[str, DocumentWrite],
) -> int:
    chunk_rows: list[tuple[Any, ...]] = []
    embedding_rows: list[tuple[Any, ...]] = []
    for doc in written:
        source = by_external[doc.external_id]
        for chunk, chunk_hash, vector in zip(
            source.chunks, source.chunk_hashes, source.embeddings, strict=True
        ):
            chunk_id = uuid.uuid4()
            chunk_rows.append(
                _chunk_row(chunk_id, tenant_id, collection_id, doc, chunk, chunk_hash)
            )
            embedding_rows.append((chunk_id, model_id, tenant_id, vector))
    bulk.insert_rows(conn, "chunks", _CHUNK_COLUMNS, _CHUNK_TYPES, chunk_rows)
    _copy_embeddings(conn, embedding_rows)
    return len(chunk_rows)


def _copy_embeddings(conn: psycopg.Connection[Any], rows: Sequence[tuple[Any, ...]]) -> None:
    """Vectors staged as float32, then stored as their model's storage says."""
    if not rows:
        return
    conn.execute("DROP TABLE IF EXISTS pg_temp.copy_chunk_embeddings")
    conn.execute(
        "CREATE TEMP TABLE copy_chunk_embeddings "
        "(chunk_id uuid, model_id int4, tenant_id uuid, embedding vector) ON COMMIT DROP"
    )
    types = ("uuid", "int4", "uuid", "vector")
    bulk.copy_rows(conn, "copy_chunk_embeddings", indexes.STAGED_COLUMNS, types, rows)
    indexes.insert_staged(conn, "copy_chunk_embeddings")


def _chunk_row(
    chunk_id: uuid.UUID,
    tenant_id: uuid.UUID,
    collection_id: uuid.UUID,
    document: WrittenDocument,
    chunk: TextChunk,
    chunk_hash: str,
) -> tuple[Any, ...]:
    return (
        chunk_id,
        tenant_id,
        collection_id,
        document.id,
        chunk.ordinal,
        chunk.text,
        chunk.token_count,
        chunk_hash,
        chunk.start_char,
        chunk.end_char,
        psycopg.types.json.Jsonb(chunk.metadata),
        None if chunk.pages is None else chunk.pages.first,
        None if chunk.pages is None else chunk.pages.last,
        document.readers,
    )


def list_documents(
    session: Session, collection_id: uuid.UUID, *, limit: int, after: str | None = None
) -> list[Document]:
    """A page of documents ordered by external id; `after` is the last id of the previous page."""
    stmt = select(Document).where(Document.collection_id == collection_id)
    if after is not None:
        stmt = stmt.where(Document.external_id > after)
    return list(session.scalars(stmt.order_by(Document.external_id).limit(limit)))


def get_document(session: Session, collection_id: uuid.UUID, external_id: str) -> Document | None:
    stmt = select(Document).where(
        Document.collection_id == collection_id, Document.external_id == external_id
    )
    return session.scalar(stmt)


def document_chunks(session: Session, document_id: uuid.UUID) -> list[Chunk]:
    stmt = select(Chunk).where(Chunk.document_id == document_id).order_by(Chunk.ordinal)
    return list(session.scalars(stmt))


# -- injection flags (`chunks.metadata.injection`, set at ingest; `ragservice db rescan`) --


@dataclass(frozen=True, slots=True)
class ScannedChunk:
    id: uuid.UUID
    text: str
    flags: list[str] | None
    """The detector's reasons stored with the chunk, or None when it is not flagged."""


def count_chunks(session: Session) -> int:
    """Chunks of the tenants the transaction sees."""
    return int(session.scalar(select(func.count()).select_from(Chunk)) or 0)


def chunks_page(session: Session, *, after: uuid.UUID | None, limit: int) -> list[ScannedChunk]:
    """Up to `limit` chunks (of the tenants the transaction sees) after `after`, by id."""
    stmt = select(Chunk.id, Chunk.text, Chunk.metadata_["injection"]).order_by(Chunk.id)
    if after is not None:
        stmt = stmt.where(Chunk.id > after)
    return [ScannedChunk(*row) for row in session.execute(stmt.limit(limit))]


_FLAG = sql_text(
    "UPDATE chunks SET metadata = metadata || jsonb_build_object('injection', "
    "CAST(:reasons AS jsonb)) WHERE id = :id"
)
_UNFLAG = sql_text("UPDATE chunks SET metadata = metadata - 'injection' WHERE id = :id")


def set_injection_flags(session: Session, flags: dict[uuid.UUID, list[str] | None]) -> None:
    """Store each chunk's reasons (a flag), or remove its flag (None)."""
    flagged = [
        {"id": chunk_id, "reasons": json.dumps(reasons)}
        for chunk_id, reasons in flags.items()
        if reasons is not None
    ]
    cleared = [{"id": chunk_id} for chunk_id, reasons in flags.items() if reasons is None]
    if flagged:
        session.execute(_FLAG, flagged)
    if cleared:
        session.execute(_UNFLAG, cleared)
