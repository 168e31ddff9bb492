"""The only SQL on collections, documents, chunks, embeddings and ingest jobs.

Bulk writes go through binary COPY on the session's own connection, so each batch of documents
commits whole or not at all together with the rest of the session's transaction.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from sqlalchemy import delete, func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from ragservice.db.models import Collection, Document, EmbeddingModel, IngestJob
from ragservice.errors import ConfigurationError
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
)

_UPSERT_DOCUMENTS = """
INSERT INTO documents AS d (tenant_id, collection_id, external_id, title, source, metadata,
                            content_hash, chunk_count, char_count)
SELECT %(tenant_id)s, %(collection_id)s, u.external_id, u.title, u.source, u.metadata::jsonb,
       u.content_hash, u.chunk_count, u.char_count
FROM unnest(%(external_ids)s::text[], %(titles)s::text[], %(sources)s::text[],
            %(metadata)s::text[], %(hashes)s::text[], %(chunk_counts)s::int[],
            %(char_counts)s::int[])
     AS u(external_id, title, source, metadata, content_hash, chunk_count, char_count)
ON CONFLICT (collection_id, external_id) DO UPDATE
SET title = EXCLUDED.title, source = EXCLUDED.source, metadata = EXCLUDED.metadata,
    content_hash = EXCLUDED.content_hash, chunk_count = EXCLUDED.chunk_count,
    char_count = EXCLUDED.char_count, version = d.version + 1, updated_at = now()
WHERE d.content_hash IS DISTINCT FROM EXCLUDED.content_hash
RETURNING d.id, d.external_id, d.version
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


@dataclass(frozen=True, slots=True)
class WrittenDocument:
    id: uuid.UUID
    external_id: str
    version: int


@dataclass(slots=True)
class BatchWriteResult:
    written: list[WrittenDocument] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    chunks: int = 0


# -- collections -----------------------------------------------------------------------------


def ensure_collection(session: Session, tenant_id: uuid.UUID, name: str) -> uuid.UUID:
    """The id of the tenant's collection `name`, created if it does not exist."""
    stmt = (
        insert(Collection)
        .values(tenant_id=tenant_id, name=name)
        .on_conflict_do_nothing(index_elements=["tenant_id", "name"])
    )
    session.execute(stmt)
    found = find_collection(session, tenant_id, name)
    assert found is not None  # inserted above or already there
    return found


def find_collection(session: Session, tenant_id: uuid.UUID, name: str) -> uuid.UUID | None:
    stmt = select(Collection.id).where(Collection.tenant_id == tenant_id, Collection.name == name)
    return session.scalar(stmt)


# -- documents -------------------------------------------------------------------------------


def document_hashes(
    session: Session, collection_id: uuid.UUID, external_ids: Sequence[str]
) -> dict[str, str]:
    """external_id → content_hash of the given documents that are already stored."""
    stmt = select(Document.external_id, Document.content_hash).where(
        Document.collection_id == collection_id, Document.external_id.in_(external_ids)
    )
    return {row.external_id: row.content_hash for row in session.execute(stmt)}


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
) -> BatchWriteResult:
    """Insert new documents and replace changed ones with their chunks and embeddings.

    A document whose stored hash already matches (another writer got there first) is left
    alone. Old chunks of a changed document are deleted (their embeddings cascade) and the
    document's version goes up by one.
    """
    conn = _driver_connection(session)
    written = _upsert_documents(conn, tenant_id, collection_id, documents)
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
    }
    rows = conn.execute(_UPSERT_DOCUMENTS, params).fetchall()
    return [WrittenDocument(id=row[0], external_id=row[1], version=row[2]) for row in rows]


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
                _chunk_row(chunk_id, tenant_id, collection_id, doc.id, chunk, chunk_hash)
            )
            embedding_rows.append((chunk_id, model_id, tenant_id, vector))
    _copy(conn, "chunks", _CHUNK_COLUMNS, _CHUNK_TYPES, chunk_rows)
    _copy(
        conn,
        "chunk_embeddings",
        ("chunk_id", "model_id", "tenant_id", "embedding"),
        ("uuid", "int4", "uuid", "vector"),
        embedding_rows,
    )
    return len(chunk_rows)


def _chunk_row(
    chunk_id: uuid.UUID,
    tenant_id: uuid.UUID,
    collection_id: uuid.UUID,
    document_id: uuid.UUID,
    chunk: TextChunk,
    chunk_hash: str,
) -> tuple[Any, ...]:
    return (
        chunk_id,
        tenant_id,
        collection_id,
        document_id,
        chunk.ordinal,
        chunk.text,
        chunk.token_count,
        chunk_hash,
        chunk.start_char,
        chunk.end_char,
        psycopg.types.json.Jsonb(chunk.metadata),
    )


def _copy(
    conn: psycopg.Connection[Any],
    table: str,
    columns: Sequence[str],
    types: Sequence[str],
    rows: Sequence[tuple[Any, ...]],
) -> None:
    if not rows:
        return
    statement = psycopg.sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        psycopg.sql.Identifier(table),
        psycopg.sql.SQL(", ").join(map(psycopg.sql.Identifier, columns)),
    )
    with conn.cursor() as cur, cur.copy(statement) as copy:
        copy.set_types(list(types))
        for row in rows:
            copy.write_row(row)


def _driver_connection(session: Session) -> psycopg.Connection[Any]:
    """The psycopg connection under the session, inside the session's transaction."""
    conn = session.connection().connection.driver_connection
    assert isinstance(conn, psycopg.Connection)
    return conn


# -- embeddings ------------------------------------------------------------------------------


def stored_embeddings(
    session: Session, *, tenant_id: uuid.UUID, model_id: int, hashes: Sequence[str]
) -> dict[str, npt.NDArray[np.float32]]:
    """Stored vectors of chunk texts with these hashes: identical text is embedded once."""
    if not hashes:
        return {}
    rows = session.execute(
        text(
            "SELECT DISTINCT ON (c.content_hash) c.content_hash, e.embedding "
            "FROM chunks c JOIN chunk_embeddings e ON e.chunk_id = c.id AND e.model_id = :model "
            "WHERE c.tenant_id = :tenant AND c.content_hash = ANY(:hashes)"
        ),
        {"model": model_id, "tenant": tenant_id, "hashes": list(hashes)},
    )
    return {row[0]: row[1].to_numpy().astype(np.float32, copy=False) for row in rows}


def register_embedding_model(
    session: Session,
    *,
    name: str,
    dimension: int,
    path: str | None,
    hnsw_m: int,
    hnsw_ef_construction: int,
) -> EmbeddingModel:
    """Record the model (version 1 if new), make sure its HNSW index exists, and activate it
    when no model is active yet. A model with the same name but another dimension is refused."""
    stmt = (
        insert(EmbeddingModel)
        .values(name=name, dimension=dimension, path=path)
        .on_conflict_do_nothing(index_elements=["name", "version"])
    )
    session.execute(stmt)
    model = session.scalars(
        select(EmbeddingModel)
        .where(EmbeddingModel.name == name)
        .order_by(EmbeddingModel.version.desc())
    ).first()
    assert model is not None
    if model.dimension != dimension:
        raise ConfigurationError(
            f"embedding model {name!r} is registered with dimension {model.dimension}, "
            f"but the loaded model has {dimension}"
        )
    session.execute(
        text("SELECT ragservice_ensure_embedding_index(:id, :dim, :m, :ef)"),
        {"id": model.id, "dim": dimension, "m": hnsw_m, "ef": hnsw_ef_construction},
    )
    if session.scalar(select(EmbeddingModel.id).where(EmbeddingModel.active)) is None:
        session.execute(
            update(EmbeddingModel).where(EmbeddingModel.id == model.id).values(active=True)
        )
        model.active = True
    return model


# -- ingest jobs -----------------------------------------------------------------------------


def start_job(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    collection_id: uuid.UUID,
    kind: str,
    params: dict[str, Any],
    worker: str,
) -> uuid.UUID:
    """Record a job that starts running now (the CLI runs its own jobs in-process)."""
    job = IngestJob(
        tenant_id=tenant_id,
        collection_id=collection_id,
        kind=kind,
        status="running",
        params=params,
        worker=worker,
        attempts=1,
        started_at=func.now(),
        heartbeat_at=func.now(),
    )
    session.add(job)
    session.flush()
    return job.id


def finish_job(
    session: Session,
    job_id: uuid.UUID,
    *,
    status: str,
    counts: dict[str, int],
    errors: list[dict[str, str]],
) -> None:
    session.execute(
        update(IngestJob)
        .where(IngestJob.id == job_id)
        .values(status=status, counts=counts, errors=errors, finished_at=func.now())
    )
