"""The only SQL on collections, documents, chunks, embeddings and ingest jobs.

Bulk writes go through binary COPY on the session's own connection, so each batch of documents
commits whole or not at all together with the rest of the session's transaction.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from sqlalchemy import (
    ColumnElement,
    Row,
    ScalarSelect,
    Select,
    and_,
    delete,
    func,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session, aliased

from ragservice.db.models import (
    ApiKey,
    Chunk,
    ChunkEmbedding,
    Collection,
    CollectionTextStats,
    Document,
    EmbeddingModel,
    Feedback,
    IngestJob,
    IngestJobItem,
    ModelActivation,
    PromptCacheEntry,
    QueryLog,
    Tenant,
)
from ragservice.errors import ConfigurationError, ConflictError, InvalidInputError
from ragservice.types import TextChunk

log = logging.getLogger(__name__)

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
    """Bulk-insert `rows`: binary COPY into a temporary table, then one INSERT from it.

    PostgreSQL refuses COPY FROM into a table under row-level security, so the rows are
    staged where no policy applies and the INSERT checks each against the table's policy."""
    if not rows:
        return
    sql = psycopg.sql
    target, staging = sql.Identifier(table), sql.Identifier(f"copy_{table}")
    names = sql.SQL(", ").join(map(sql.Identifier, columns))
    conn.execute(sql.SQL("DROP TABLE IF EXISTS pg_temp.{}").format(staging))
    conn.execute(
        sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA").format(
            staging, names, target
        )
    )
    _copy_rows(conn, f"copy_{table}", columns, types, rows)
    conn.execute(
        sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(target, names, names, staging)
    )


def _copy_rows(
    conn: psycopg.Connection[Any],
    table: str,
    columns: Sequence[str],
    types: Sequence[str],
    rows: Sequence[tuple[Any, ...]],
) -> None:
    """Binary COPY of `rows` into `table` (one without row-level security)."""
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


# -- collections (API) -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CollectionInfo:
    id: uuid.UUID
    name: str
    description: str | None
    metadata: dict[str, Any]
    created_at: datetime
    document_count: int
    chunk_count: int
    cache_ttl_seconds: int | None = None


def create_collection(
    session: Session,
    tenant_id: uuid.UUID,
    name: str,
    *,
    description: str | None = None,
    metadata: dict[str, Any] | None = None,
    cache_ttl_seconds: int | None = None,
) -> uuid.UUID:
    """Create the tenant's collection `name`; ConflictError when the name is taken."""
    stmt = (
        insert(Collection)
        .values(
            tenant_id=tenant_id,
            name=name,
            description=description,
            metadata_=metadata or {},
            cache_ttl_seconds=cache_ttl_seconds,
        )
        .on_conflict_do_nothing(index_elements=["tenant_id", "name"])
        .returning(Collection.id)
    )
    created = session.scalar(stmt)
    if created is None:
        raise ConflictError(f"collection {name!r} already exists")
    return created


def list_collections(session: Session, tenant_id: uuid.UUID) -> list[CollectionInfo]:
    return [_collection_info(row) for row in session.execute(_collections_query(tenant_id))]


def get_collection(session: Session, tenant_id: uuid.UUID, name: str) -> CollectionInfo | None:
    row = session.execute(_collections_query(tenant_id).where(Collection.name == name)).first()
    return None if row is None else _collection_info(row)


def set_collection_cache_ttl(
    session: Session, tenant_id: uuid.UUID, name: str, ttl_seconds: int | None
) -> bool:
    stmt = (
        update(Collection)
        .where(Collection.tenant_id == tenant_id, Collection.name == name)
        .values(cache_ttl_seconds=ttl_seconds, updated_at=func.now())
    )
    return bool(session.execute(stmt).rowcount)  # type: ignore[attr-defined]


def delete_collection(session: Session, tenant_id: uuid.UUID, name: str) -> bool:
    """Delete a collection with its documents, chunks, embeddings and jobs (cascades)."""
    stmt = delete(Collection).where(Collection.tenant_id == tenant_id, Collection.name == name)
    return bool(session.execute(stmt).rowcount)  # type: ignore[attr-defined]


def collection_ids(
    session: Session, tenant_id: uuid.UUID, names: Sequence[str] | None
) -> dict[str, uuid.UUID]:
    """name → id of the tenant's collections with these names (all of them for None)."""
    stmt = select(Collection.name, Collection.id).where(Collection.tenant_id == tenant_id)
    if names is not None:
        stmt = stmt.where(Collection.name.in_(list(names)))
    return {row.name: row.id for row in session.execute(stmt)}


def _collections_query(tenant_id: uuid.UUID) -> Select[Any]:
    documents = (
        select(func.count())
        .where(Document.collection_id == Collection.id)
        .scalar_subquery()
        .label("document_count")
    )
    chunks = (
        select(CollectionTextStats.chunk_count)
        .where(CollectionTextStats.collection_id == Collection.id)
        .scalar_subquery()
        .label("chunk_count")
    )
    return (
        select(Collection, documents, chunks)
        .where(Collection.tenant_id == tenant_id)
        .order_by(Collection.name)
    )


def _collection_info(row: Row[Any]) -> CollectionInfo:
    collection: Collection = row[0]
    return CollectionInfo(
        id=collection.id,
        name=collection.name,
        description=collection.description,
        metadata=collection.metadata_,
        created_at=collection.created_at,
        cache_ttl_seconds=collection.cache_ttl_seconds,
        document_count=int(row.document_count or 0),
        chunk_count=int(row.chunk_count or 0),
    )


# -- documents (API) -------------------------------------------------------------------------


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


# -- tenants and API keys --------------------------------------------------------------------


def ensure_tenant(session: Session, name: str) -> uuid.UUID:
    """The id of the tenant `name`, created if it does not exist."""
    session.execute(insert(Tenant).values(name=name).on_conflict_do_nothing())
    tenant_id = session.scalar(select(Tenant.id).where(Tenant.name == name))
    assert tenant_id is not None
    return tenant_id


def create_api_key(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    role: str,
    prefix: str,
    key_hash: str,
    name: str | None = None,
) -> uuid.UUID:
    key = ApiKey(tenant_id=tenant_id, role=role, prefix=prefix, key_hash=key_hash, name=name)
    session.add(key)
    session.flush()
    return key.id


def find_api_key(session: Session, key_hash: str) -> ApiKey | None:
    """The key with this hash, unless it was revoked."""
    stmt = select(ApiKey).where(ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None))
    return session.scalar(stmt)


def list_api_keys(session: Session) -> list[tuple[ApiKey, str]]:
    """Every key with its tenant's name, newest first."""
    stmt = (
        select(ApiKey, Tenant.name)
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .order_by(ApiKey.created_at.desc())
    )
    return [(row[0], row[1]) for row in session.execute(stmt)]


def revoke_api_key(session: Session, prefix: str) -> int:
    """Revoke the keys that start with `prefix`; returns how many were revoked."""
    stmt = (
        update(ApiKey)
        .where(ApiKey.prefix == prefix, ApiKey.revoked_at.is_(None))
        .values(revoked_at=func.now())
    )
    return int(session.execute(stmt).rowcount)  # type: ignore[attr-defined]


# -- query log -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueryRecord:
    """One answered question as the query log keeps it."""

    tenant_id: uuid.UUID
    endpoint: str
    question: str
    collection_ids: Sequence[uuid.UUID]
    params: dict[str, Any]
    retrieved: list[dict[str, Any]]
    answer: str | None
    citations: list[dict[str, Any]]
    timings: dict[str, float]
    upstream_model: str | None
    status: str
    error: str | None = None
    cache: dict[str, Any] | None = None
    messages: list[dict[str, Any]] | None = None  # the prompt the answer was generated from
    id: uuid.UUID = field(default_factory=uuid.uuid4)  # known before the row is written


def log_query(session: Session, record: QueryRecord) -> uuid.UUID:
    entry = QueryLog(
        id=record.id,
        tenant_id=record.tenant_id,
        endpoint=record.endpoint,
        question=record.question,
        collection_ids=list(record.collection_ids),
        params=record.params,
        retrieved=record.retrieved,
        answer=record.answer,
        citations=record.citations,
        timings=record.timings,
        upstream_model=record.upstream_model,
        status=record.status,
        error=record.error,
        cache=record.cache,
        messages=record.messages,
    )
    session.add(entry)
    session.flush()
    return entry.id


# -- prompt cache ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CachedEntry:
    id: uuid.UUID
    prompt: str
    response: dict[str, Any]
    similarity: float


@dataclass(frozen=True, slots=True)
class NewCacheEntry:
    tenant_id: uuid.UUID
    scope: str
    model_id: int
    collection_ids: Sequence[uuid.UUID]
    prompt_hash: str
    prompt: str
    embedding: npt.NDArray[np.float32]
    answer: str
    response: dict[str, Any]
    ttl_seconds: int
    sources: dict[uuid.UUID, int]  # document id → the version the answer was built from


_CACHE_NEAREST = """
WITH nearest AS MATERIALIZED (
    SELECT id, prompt, response, embedding::vector({dim}) <=> %(vector)s::vector({dim}) AS distance
    FROM prompt_cache
    WHERE model_id = {model_id} AND scope = %(scope)s AND expires_at > now()
    ORDER BY distance
    LIMIT %(limit)s
)
SELECT id, prompt, response, 1 - distance FROM nearest
WHERE 1 - distance >= %(threshold)s ORDER BY distance, id
"""

_CACHE_INSERT = """
INSERT INTO prompt_cache AS p (tenant_id, scope, model_id, collection_ids, prompt_hash, prompt,
                               embedding, answer, response, expires_at)
VALUES (%(tenant_id)s, %(scope)s, %(model_id)s, %(collection_ids)s, %(prompt_hash)s, %(prompt)s,
        %(embedding)s, %(answer)s, %(response)s, now() + make_interval(secs => %(ttl)s))
ON CONFLICT (scope, prompt_hash) DO {conflict}
RETURNING id
"""

_CACHE_REPLACE = """UPDATE SET prompt = EXCLUDED.prompt, embedding = EXCLUDED.embedding,
    answer = EXCLUDED.answer, response = EXCLUDED.response, created_at = now(),
    expires_at = EXCLUDED.expires_at, hits = 0, last_hit_at = NULL"""


def cache_exact(session: Session, scope: str, prompt_hash: str) -> CachedEntry | None:
    row = session.execute(
        select(PromptCacheEntry.id, PromptCacheEntry.prompt, PromptCacheEntry.response).where(
            PromptCacheEntry.scope == scope,
            PromptCacheEntry.prompt_hash == prompt_hash,
            PromptCacheEntry.expires_at > func.now(),
        )
    ).first()
    return None if row is None else CachedEntry(row[0], row[1], row[2], 1.0)


def cache_nearest(
    session: Session,
    *,
    scope: str,
    model_id: int,
    dimension: int,
    vector: npt.NDArray[np.float32],
    threshold: float,
    limit: int = 3,
) -> list[CachedEntry]:
    """The closest unexpired entries of the scope at or above `threshold`, closest first."""
    conn = _driver_connection(session)
    # The scope filter is selective: iterative scans keep reading the index until rows pass.
    conn.execute("SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true)")
    query = psycopg.sql.SQL(_CACHE_NEAREST).format(
        dim=psycopg.sql.Literal(int(dimension)), model_id=psycopg.sql.Literal(int(model_id))
    )
    params = {"vector": vector, "scope": scope, "limit": limit, "threshold": threshold}
    rows = conn.execute(query, params, prepare=False).fetchall()
    return [CachedEntry(row[0], row[1], row[2], float(row[3])) for row in rows]


def cache_hit(session: Session, entry_id: uuid.UUID) -> None:
    """Count a hit. The expiry stays where it is: a popular answer must not live for ever.

    A statistic: its commit need not wait for the WAL flush (an exact hit answers in ~1 ms)."""
    session.execute(text("SET LOCAL synchronous_commit = off"))
    session.execute(
        update(PromptCacheEntry)
        .where(PromptCacheEntry.id == entry_id)
        .values(hits=PromptCacheEntry.hits + 1, last_hit_at=func.now())
    )


def cache_store(
    session: Session, entry: NewCacheEntry, *, replace: bool = False
) -> uuid.UUID | None:
    """Store an answer unless a source changed since it was retrieved (then None).

    The sources are locked against updates until this transaction ends, so an answer built from
    an old version can never be stored after the new version invalidated the cache.
    """
    if not _sources_current(session, entry.sources):
        return None
    conn = _driver_connection(session)
    # An expired entry that the purger has not reached yet is replaced like a refreshed one.
    conflict = _CACHE_REPLACE if replace else _CACHE_REPLACE + " WHERE p.expires_at <= now()"
    statement = _CACHE_INSERT.format(conflict=conflict)
    row = conn.execute(statement, _cache_params(entry)).fetchone()
    if row is None:  # an identical miss was stored first by someone else
        return None
    entry_id: uuid.UUID = row[0]
    conn.execute("DELETE FROM prompt_cache_sources WHERE entry_id = %s", (entry_id,))
    conn.execute(
        "INSERT INTO prompt_cache_sources (entry_id, document_id, document_version) "
        "SELECT %s, unnest(%s::uuid[]), unnest(%s::int[])",
        (entry_id, list(entry.sources), list(entry.sources.values())),
    )
    return entry_id


def _sources_current(session: Session, sources: dict[uuid.UUID, int]) -> bool:
    if not sources:
        return True
    # A fixed lock order, and a bounded wait: never a deadlock with an ingest batch.
    session.execute(text("SET LOCAL lock_timeout = '2s'"))
    rows = session.execute(
        select(Document.id, Document.version)
        .where(Document.id.in_(list(sources)))
        .order_by(Document.id)
        .with_for_update(read=True)
    ).all()
    return len(rows) == len(sources) and all(sources[row[0]] == row[1] for row in rows)


def _cache_params(entry: NewCacheEntry) -> dict[str, Any]:
    return {
        "tenant_id": entry.tenant_id,
        "scope": entry.scope,
        "model_id": entry.model_id,
        "collection_ids": list(entry.collection_ids),
        "prompt_hash": entry.prompt_hash,
        "prompt": entry.prompt,
        "embedding": entry.embedding,
        "answer": entry.answer,
        "response": psycopg.types.json.Jsonb(entry.response),
        "ttl": entry.ttl_seconds,
    }


def cache_ttl(session: Session, collection_ids: Sequence[uuid.UUID], default: int) -> int:
    """The shortest lifetime the collections ask for, or `default` when none sets one."""
    ttls = session.scalars(
        select(Collection.cache_ttl_seconds).where(
            Collection.id.in_(list(collection_ids)), Collection.cache_ttl_seconds.is_not(None)
        )
    ).all()
    return min((int(t) for t in ttls if t is not None), default=default)


def cache_stats(session: Session, tenant_id: uuid.UUID, collection_id: uuid.UUID) -> dict[str, Any]:
    """Entries, their bytes and hits, and the hit rate of logged queries on the collection."""
    entries = session.execute(
        text(
            "SELECT count(*), coalesce(sum(pg_column_size(c.*)), 0), coalesce(sum(hits), 0) "
            "FROM prompt_cache c WHERE tenant_id = :t AND :c = ANY(collection_ids) "
            "AND expires_at > now()"
        ),
        {"t": tenant_id, "c": collection_id},
    ).one()
    queries = session.execute(
        text(
            "SELECT count(*), count(*) FILTER (WHERE (cache ->> 'hit')::boolean) FROM query_log "
            "WHERE tenant_id = :t AND :c = ANY(collection_ids)"
        ),
        {"t": tenant_id, "c": collection_id},
    ).one()
    return {
        "entries": int(entries[0]),
        "bytes": int(entries[1]),
        "entry_hits": int(entries[2]),
        "queries": int(queries[0]),
        "cache_hits": int(queries[1]),
        "hit_rate": round(queries[1] / queries[0], 4) if queries[0] else 0.0,
    }


def purge_cache(session: Session, tenant_id: uuid.UUID, collection_id: uuid.UUID) -> int:
    """Delete every entry of the tenant that covers the collection."""
    stmt = delete(PromptCacheEntry).where(
        PromptCacheEntry.tenant_id == tenant_id,
        PromptCacheEntry.collection_ids.contains([collection_id]),
    )
    return int(session.execute(stmt).rowcount)  # type: ignore[attr-defined]


def purge_expired_cache(session: Session) -> int:
    stmt = delete(PromptCacheEntry).where(PromptCacheEntry.expires_at <= func.now())
    return int(session.execute(stmt).rowcount)  # type: ignore[attr-defined]


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
    ensure_model_indexes(
        session, model.id, dimension, hnsw_m=hnsw_m, hnsw_ef_construction=hnsw_ef_construction
    )
    if session.scalar(select(EmbeddingModel.id).where(EmbeddingModel.active)) is None:
        session.execute(
            update(EmbeddingModel).where(EmbeddingModel.id == model.id).values(active=True)
        )
        model.active = True
    return model


def ensure_model_indexes(
    session: Session, model_id: int, dimension: int, *, hnsw_m: int, hnsw_ef_construction: int
) -> None:
    """The model's partial HNSW indexes on chunk embeddings and on the prompt cache."""
    session.execute(
        text("SELECT ragservice_ensure_embedding_index(:id, :dim, :m, :ef)"),
        {"id": model_id, "dim": dimension, "m": hnsw_m, "ef": hnsw_ef_construction},
    )
    session.execute(
        text("SELECT ragservice_ensure_cache_index(:id, :dim)"), {"id": model_id, "dim": dimension}
    )


# -- embedding model versions ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChunkToEmbed:
    id: uuid.UUID
    tenant_id: uuid.UUID
    text: str


def active_model(session: Session) -> EmbeddingModel | None:
    return session.scalar(select(EmbeddingModel).where(EmbeddingModel.active))


def get_model(session: Session, model_id: int) -> EmbeddingModel | None:
    return session.get(EmbeddingModel, model_id)


def find_model(session: Session, name: str, version: int | None = None) -> EmbeddingModel | None:
    """The model `name` at `version`, or its latest version when `version` is None."""
    stmt = select(EmbeddingModel).where(EmbeddingModel.name == name)
    if version is not None:
        stmt = stmt.where(EmbeddingModel.version == version)
    return session.scalars(stmt.order_by(EmbeddingModel.version.desc()).limit(1)).first()


def list_models(session: Session) -> list[EmbeddingModel]:
    order = (EmbeddingModel.name, EmbeddingModel.version)
    return list(session.scalars(select(EmbeddingModel).order_by(*order)))


def embedded_counts(session: Session) -> dict[int, int]:
    """model id → chunks that have an embedding of that model (models without any are absent)."""
    rows = session.execute(
        text("SELECT model_id, count(*) FROM chunk_embeddings GROUP BY model_id")
    )
    return {int(row[0]): int(row[1]) for row in rows}


def chunk_total(session: Session) -> int:
    return int(session.scalar(select(func.count()).select_from(Chunk)) or 0)


def missing_embeddings(session: Session, model_id: int) -> int:
    """Chunks, of every tenant, without an embedding of the model."""
    stmt = select(func.count()).select_from(Chunk).where(~_has_embedding(model_id))
    return int(session.scalar(stmt) or 0)


def chunks_to_embed(
    session: Session, model_id: int, *, after: uuid.UUID | None, limit: int
) -> list[ChunkToEmbed]:
    """The next `limit` chunks by id after `after` that have no embedding of the model."""
    stmt = select(Chunk.id, Chunk.tenant_id, Chunk.text).where(~_has_embedding(model_id))
    if after is not None:
        stmt = stmt.where(Chunk.id > after)
    rows = session.execute(stmt.order_by(Chunk.id).limit(limit))
    return [ChunkToEmbed(id=row[0], tenant_id=row[1], text=row[2]) for row in rows]


def _has_embedding(model_id: int) -> ColumnElement[bool]:
    return (
        select(ChunkEmbedding.chunk_id)
        .where(ChunkEmbedding.chunk_id == Chunk.id, ChunkEmbedding.model_id == model_id)
        .exists()
    )


def add_embeddings(
    session: Session,
    model_id: int,
    chunks: Sequence[ChunkToEmbed],
    vectors: npt.NDArray[np.float32],
) -> int:
    """Store the chunks' vectors of the model (one COPY); chunks deleted meanwhile and
    embeddings another writer stored first are skipped. Returns the rows inserted."""
    conn = _driver_connection(session)
    conn.execute(
        "CREATE TEMP TABLE new_embeddings (chunk_id uuid, tenant_id uuid, embedding vector) "
        "ON COMMIT DROP"
    )
    rows = [(c.id, c.tenant_id, v) for c, v in zip(chunks, vectors, strict=True)]
    columns = ("chunk_id", "tenant_id", "embedding")
    _copy_rows(conn, "new_embeddings", columns, ("uuid", "uuid", "vector"), rows)
    inserted = conn.execute(
        "INSERT INTO chunk_embeddings (chunk_id, model_id, tenant_id, embedding) "
        "SELECT n.chunk_id, %s, n.tenant_id, n.embedding FROM new_embeddings n "
        "JOIN chunks c ON c.id = n.chunk_id ON CONFLICT DO NOTHING",
        (model_id,),
    )
    return inserted.rowcount


def next_model_version(session: Session, name: str) -> int:
    """The version a new model called `name` gets. Holds a lock on the name until the
    transaction ends, so two registrations at once never pick the same version."""
    session.execute(
        text("SELECT pg_advisory_xact_lock(hashtext('embedding_models:' || :name))"),
        {"name": name},
    )
    latest = find_model(session, name)
    return 1 if latest is None else latest.version + 1


def register_model_version(
    session: Session,
    *,
    name: str,
    version: int,
    dimension: int,
    path: str,
    base_model_id: int | None,
    details: dict[str, Any],
    hnsw_m: int,
    hnsw_ef_construction: int,
) -> EmbeddingModel:
    """Record a model version (see `next_model_version`), inactive, with its indexes."""
    model = EmbeddingModel(
        name=name,
        version=version,
        dimension=dimension,
        path=path,
        base_model_id=base_model_id,
        details=details,
        active=False,
    )
    session.add(model)
    session.flush()
    ensure_model_indexes(
        session, model.id, dimension, hnsw_m=hnsw_m, hnsw_ef_construction=hnsw_ef_construction
    )
    return model


def activate_model(session: Session, model_id: int) -> int | None:
    """Make the model the active one and record the switch; returns the previously active
    model's id. Servers notice the change at their next model check."""
    # Locks the (small) table's rows: two activations at once run one after the other.
    rows = session.scalars(select(EmbeddingModel).with_for_update()).all()
    previous = next((row.id for row in rows if row.active), None)
    if previous == model_id:
        return previous
    session.execute(update(EmbeddingModel).where(EmbeddingModel.active).values(active=False))
    session.execute(update(EmbeddingModel).where(EmbeddingModel.id == model_id).values(active=True))
    session.add(ModelActivation(model_id=model_id, previous_model_id=previous))
    session.flush()
    return previous


def last_activation(session: Session) -> ModelActivation | None:
    stmt = select(ModelActivation).order_by(ModelActivation.id.desc()).limit(1)
    return session.scalars(stmt).first()


def drop_model_embeddings(session: Session, model_id: int) -> int:
    """Delete the model's chunk embeddings, their HNSW index and its cache entries."""
    deleted = session.execute(
        delete(ChunkEmbedding).where(ChunkEmbedding.model_id == model_id)
    ).rowcount  # type: ignore[attr-defined]
    session.execute(delete(PromptCacheEntry).where(PromptCacheEntry.model_id == model_id))
    # DDL needs the table's owner: the function runs with its rights (migration 0007).
    session.execute(text("SELECT ragservice_drop_embedding_index(:id)"), {"id": model_id})
    return int(deleted)


# -- ingest jobs -----------------------------------------------------------------------------

CLI_JOB_KIND = "cli"
"""Jobs the ingest CLI runs in-process; workers never claim them."""

_ITEM_COLUMNS = ("job_id", "ordinal", "kind", "name", "title", "body", "metadata")
_ITEM_TYPES = ("uuid", "int4", "text", "text", "text", "bytea", "jsonb")


@dataclass(frozen=True, slots=True)
class JobItem:
    """One input of a queued job.

    A `file` item carries the uploaded file's name and bytes; a `text` item carries the
    document's external id in `name`, its title, and its UTF-8 text in `body`.
    """

    kind: str
    name: str
    title: str | None
    body: bytes
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job a worker has just claimed; `collection` is None when the collection is gone."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    collection_id: uuid.UUID | None
    collection: str | None
    kind: str
    params: dict[str, Any]
    attempts: int
    worker: str


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


def enqueue_job(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    collection_id: uuid.UUID,
    kind: str,
    params: dict[str, Any],
    items: Sequence[JobItem],
) -> uuid.UUID:
    """Queue a job with its items (one COPY); workers see it once the transaction commits."""
    job = IngestJob(
        tenant_id=tenant_id, collection_id=collection_id, kind=kind, status="queued", params=params
    )
    session.add(job)
    session.flush()
    rows = [_item_row(job.id, ordinal, item) for ordinal, item in enumerate(items)]
    _copy(_driver_connection(session), "ingest_job_items", _ITEM_COLUMNS, _ITEM_TYPES, rows)
    return job.id


def _item_row(job_id: uuid.UUID, ordinal: int, item: JobItem) -> tuple[Any, ...]:
    metadata = psycopg.types.json.Jsonb(item.metadata)
    return (job_id, ordinal, item.kind, item.name, item.title, item.body, metadata)


def claim_job(
    session: Session, *, worker: str, stale_after_seconds: float, max_attempts: int
) -> ClaimedJob | None:
    """Claim the oldest job that is queued, or running without a heartbeat for
    `stale_after_seconds` (its worker died): attempts goes up by one and `worker` owns it.

    Stale jobs that already used `max_attempts` are marked failed instead. SKIP LOCKED lets
    any number of workers claim at once: each gets a different job, or none, without waiting.
    """
    stale = _stale_jobs(stale_after_seconds)
    _fail_exhausted(session, stale, max_attempts)
    job_id = session.scalar(
        select(IngestJob.id)
        .where(
            IngestJob.kind != CLI_JOB_KIND,
            or_(IngestJob.status == "queued", and_(stale, IngestJob.attempts < max_attempts)),
        )
        .order_by(IngestJob.created_at)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    if job_id is None:
        return None
    job = session.execute(
        update(IngestJob)
        .where(IngestJob.id == job_id)
        .values(
            status="running",
            attempts=IngestJob.attempts + 1,
            worker=worker,
            heartbeat_at=func.now(),
            started_at=func.now(),
        )
        .returning(IngestJob)
    ).scalar_one()
    return _claimed(session, job)


def _stale_jobs(stale_after_seconds: float) -> ColumnElement[bool]:
    cutoff = func.now() - timedelta(seconds=stale_after_seconds)
    return and_(IngestJob.status == "running", IngestJob.heartbeat_at < cutoff)


def _fail_exhausted(session: Session, stale: ColumnElement[bool], max_attempts: int) -> None:
    exhausted = session.execute(
        select(IngestJob.id, IngestJob.attempts, IngestJob.worker)
        .where(IngestJob.kind != CLI_JOB_KIND, stale, IngestJob.attempts >= max_attempts)
        .with_for_update(skip_locked=True)
    ).all()
    for job_id, attempts, worker in exhausted:
        error = f"gave up after {attempts} attempts: worker {worker} stopped sending heartbeats"
        log.warning("job %s failed: %s", job_id, error)
        session.execute(
            update(IngestJob)
            .where(IngestJob.id == job_id)
            .values(status="failed", finished_at=func.now(), errors=[{"error": error}])
        )


def _claimed(session: Session, job: IngestJob) -> ClaimedJob:
    collection = session.scalar(
        select(Collection.name).where(
            Collection.id == job.collection_id, Collection.tenant_id == job.tenant_id
        )
    )
    assert job.worker is not None
    return ClaimedJob(
        id=job.id,
        tenant_id=job.tenant_id,
        collection_id=job.collection_id,
        collection=collection,
        kind=job.kind,
        params=job.params,
        attempts=job.attempts,
        worker=job.worker,
    )


def heartbeat_job(
    session: Session, job_id: uuid.UUID, worker: str, *, counts: dict[str, int] | None = None
) -> bool:
    """Mark `worker`'s running job alive, recording `counts` if given.

    False when the job is no longer this worker's: another worker took it over after the
    heartbeats stopped, or the job is gone (its collection was deleted).
    """
    values: dict[str, Any] = {"heartbeat_at": func.now()}
    if counts is not None:
        values["counts"] = counts
    stmt = update(IngestJob).where(_owned_by(job_id, worker)).values(**values)
    return session.scalar(stmt.returning(IngestJob.id)) is not None


def release_job(session: Session, job_id: uuid.UUID, worker: str) -> bool:
    """Put a job its worker stopped before finishing back in the queue; the interrupted
    attempt does not count. False when the job was no longer this worker's."""
    stmt = (
        update(IngestJob)
        .where(_owned_by(job_id, worker))
        .values(
            status="queued",
            worker=None,
            heartbeat_at=None,
            attempts=func.greatest(IngestJob.attempts - 1, 0),
        )
        .returning(IngestJob.id)
    )
    return session.scalar(stmt) is not None


def _owned_by(job_id: uuid.UUID, worker: str) -> ColumnElement[bool]:
    return and_(IngestJob.id == job_id, IngestJob.worker == worker, IngestJob.status == "running")


def job_items(session: Session, job_id: uuid.UUID) -> Iterator[JobItem]:
    """The job's items in order, fetched one at a time from a server-side cursor (a body may
    be tens of MB); iterate while the session is open."""
    stmt = (
        select(
            IngestJobItem.kind,
            IngestJobItem.name,
            IngestJobItem.title,
            IngestJobItem.body,
            IngestJobItem.metadata_,
        )
        .where(IngestJobItem.job_id == job_id)
        .order_by(IngestJobItem.ordinal)
        .execution_options(yield_per=1)
    )
    for kind, name, title, body, metadata in session.execute(stmt):
        yield JobItem(kind=kind, name=name, title=title, body=bytes(body), metadata=metadata)


def finish_job(
    session: Session,
    job_id: uuid.UUID,
    *,
    status: str,
    counts: dict[str, int],
    errors: list[dict[str, str]],
    worker: str | None = None,
) -> bool:
    """Record how a job ended. With `worker`, only while that worker still owns the job.

    A job that is done drops its items to free the space; a failed job keeps them, so an
    operator can queue it again. False when nothing was updated.
    """
    stmt = update(IngestJob).where(IngestJob.id == job_id)
    if worker is not None:
        stmt = stmt.where(_owned_by(job_id, worker))
    stmt = stmt.values(status=status, counts=counts, errors=errors, finished_at=func.now())
    finished = session.scalar(stmt.returning(IngestJob.id)) is not None
    if finished and status == "done":
        session.execute(delete(IngestJobItem).where(IngestJobItem.job_id == job_id))
    return finished


def get_job(session: Session, tenant_id: uuid.UUID, job_id: uuid.UUID) -> IngestJob | None:
    """The tenant's job `job_id`; None for another tenant's job, as for a missing one."""
    stmt = select(IngestJob).where(IngestJob.id == job_id, IngestJob.tenant_id == tenant_id)
    return session.scalar(stmt)


def list_jobs(
    session: Session,
    tenant_id: uuid.UUID,
    *,
    collection_id: uuid.UUID | None = None,
    status: str | None = None,
    limit: int = 50,
    before: uuid.UUID | None = None,
) -> list[IngestJob]:
    """The tenant's jobs, newest first; `before` is the last job id of the previous page
    (a job id that is not the tenant's gives an empty page)."""
    stmt = select(IngestJob).where(IngestJob.tenant_id == tenant_id)
    if collection_id is not None:
        stmt = stmt.where(IngestJob.collection_id == collection_id)
    if status is not None:
        stmt = stmt.where(IngestJob.status == status)
    if before is not None:
        position = _job_position(tenant_id, before)
        stmt = stmt.where(tuple_(IngestJob.created_at, IngestJob.id) < position)
    order = (IngestJob.created_at.desc(), IngestJob.id.desc())
    return list(session.scalars(stmt.order_by(*order).limit(limit)))


def _job_position(tenant_id: uuid.UUID, job_id: uuid.UUID) -> ScalarSelect[Any]:
    # An alias, so that the subquery is not correlated with the outer query's ingest_jobs.
    cursor = aliased(IngestJob)
    return (
        select(cursor.created_at, cursor.id)
        .where(cursor.id == job_id, cursor.tenant_id == tenant_id)
        .scalar_subquery()
    )


# -- feedback and exports --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoggedQuery:
    """What feedback on an answer is checked against."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    collection_ids: list[uuid.UUID]


@dataclass(frozen=True, slots=True)
class NewFeedback:
    query_id: uuid.UUID
    tenant_id: uuid.UUID
    rating: int | None
    scale: str
    comment: str | None
    corrected_answer: str | None
    relevant_chunk_ids: Sequence[uuid.UUID]
    irrelevant_chunk_ids: Sequence[uuid.UUID]
    key_id: uuid.UUID | None = None


@dataclass(frozen=True, slots=True)
class FeedbackEntry:
    """One feedback row as an export reads it."""

    rating: int | None
    scale: str
    corrected_answer: str | None
    relevant: tuple[uuid.UUID, ...]
    irrelevant: tuple[uuid.UUID, ...]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ExportRow:
    """A logged answer with its feedback (oldest first) and the texts of the chunks an export
    may need: the top of `ranked`, the cited ones and the judged ones (empty when not asked)."""

    query_id: uuid.UUID
    question: str
    answer: str | None
    status: str
    messages: list[dict[str, Any]] | None
    ranked: tuple[uuid.UUID, ...]  # retrieved chunk ids, best first
    cited: tuple[uuid.UUID, ...]
    collection_ids: tuple[uuid.UUID, ...]  # sorted
    created_at: datetime
    feedback: tuple[FeedbackEntry, ...]
    chunk_texts: dict[uuid.UUID, str]
    question_key: str  # lower case, white space collapsed, trailing punctuation dropped


def find_tenant(session: Session, name: str) -> uuid.UUID | None:
    return session.scalar(select(Tenant.id).where(Tenant.name == name))


def find_logged_query(
    session: Session, tenant_id: uuid.UUID, query_id: uuid.UUID
) -> LoggedQuery | None:
    """The tenant's logged answer `query_id`; None for another tenant's, as for a missing one."""
    row = session.execute(
        select(QueryLog.id, QueryLog.tenant_id, QueryLog.collection_ids).where(
            QueryLog.id == query_id, QueryLog.tenant_id == tenant_id
        )
    ).first()
    return None if row is None else LoggedQuery(row[0], row[1], list(row[2]))


_CHUNKS_OUTSIDE_QUERY = text("""
SELECT u.id
FROM query_log q, unnest(CAST(:ids AS uuid[])) WITH ORDINALITY AS u(id, n)
WHERE q.id = :query AND q.tenant_id = :tenant
  AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(q.retrieved) AS r(item)
                  WHERE r.item ->> 'chunk_id' = CAST(u.id AS text))
  AND NOT EXISTS (SELECT 1 FROM chunks c
                  WHERE c.id = u.id AND c.tenant_id = q.tenant_id
                    AND c.collection_id = ANY(q.collection_ids))
ORDER BY u.n
""")


def chunks_outside_query(
    session: Session, query: LoggedQuery, chunk_ids: Sequence[uuid.UUID]
) -> list[uuid.UUID]:
    """The ids among `chunk_ids` that were not retrieved for the query and are not chunks of
    the query's tenant in one of its collections, in the order given."""
    if not chunk_ids:
        return []
    params = {"ids": list(chunk_ids), "query": query.id, "tenant": query.tenant_id}
    return list(session.scalars(_CHUNKS_OUTSIDE_QUERY, params))


def add_feedback(session: Session, feedback: NewFeedback) -> Feedback:
    stmt = (
        insert(Feedback)
        .values(
            query_id=feedback.query_id,
            tenant_id=feedback.tenant_id,
            rating=feedback.rating,
            scale=feedback.scale,
            comment=feedback.comment,
            corrected_answer=feedback.corrected_answer,
            relevant_chunk_ids=list(feedback.relevant_chunk_ids),
            irrelevant_chunk_ids=list(feedback.irrelevant_chunk_ids),
            key_id=feedback.key_id,
        )
        .returning(Feedback)
    )
    return session.scalars(stmt).one()


# Each answer with feedback, its feedback rows aggregated oldest first, and its latest rating
# (the rating filters apply to that one). Only fixed fragments are substituted into it.
_EXPORT_ROWS = """
SELECT q.id, q.question, q.answer, q.status, q.messages, q.retrieved, q.citations,
       ARRAY(SELECT c FROM unnest(q.collection_ids) AS c ORDER BY c) AS scope,
       q.created_at, fb.entries, {texts} AS texts,
       regexp_replace(lower(regexp_replace(btrim(q.question), '[[:space:]]+', ' ', 'g')),
                      '[[:space:][:punct:]]+$', '') AS question_key
FROM query_log q
CROSS JOIN LATERAL (
    SELECT jsonb_agg(jsonb_build_object(
               'rating', f.rating, 'scale', f.scale, 'corrected_answer', f.corrected_answer,
               'relevant', f.relevant_chunk_ids, 'irrelevant', f.irrelevant_chunk_ids,
               'created_at', f.created_at) ORDER BY f.created_at, f.id) AS entries,
           (array_agg(f.rating ORDER BY f.created_at DESC, f.id DESC)
                FILTER (WHERE f.rating IS NOT NULL))[1] AS rating
    FROM feedback f
    WHERE f.query_id = q.id AND f.tenant_id = q.tenant_id AND {feedback_window}
) fb
WHERE q.tenant_id = :tenant
  AND q.id IN (SELECT f.query_id FROM feedback f WHERE f.tenant_id = :tenant AND {feedback_window})
  AND fb.entries IS NOT NULL
  AND (CAST(:collection AS uuid) IS NULL OR CAST(:collection AS uuid) = ANY(q.collection_ids))
  AND {query_window}
  AND (CAST(:min_rating AS int) IS NULL OR fb.rating >= CAST(:min_rating AS int))
  AND (CAST(:max_rating AS int) IS NULL OR fb.rating <= CAST(:max_rating AS int))
ORDER BY {order}
"""

_EXPORT_TEXTS = """(
    SELECT jsonb_object_agg(CAST(c.id AS text), c.text) FROM chunks c
    WHERE c.tenant_id = q.tenant_id AND c.id IN (
        SELECT CAST(r.item ->> 'chunk_id' AS uuid)
        FROM jsonb_array_elements(q.retrieved) WITH ORDINALITY AS r(item, n)
        WHERE r.n <= :depth
        UNION
        SELECT CAST(jsonb_array_elements_text(s.item -> 'chunk_ids') AS uuid)
        FROM jsonb_array_elements(q.citations) AS s(item)
        UNION
        SELECT unnest(f.relevant_chunk_ids || f.irrelevant_chunk_ids) FROM feedback f
        WHERE f.query_id = q.id AND f.tenant_id = q.tenant_id))"""

_WINDOW = (
    "(CAST(:since AS timestamptz) IS NULL OR {column} >= CAST(:since AS timestamptz)) "
    "AND (CAST(:until AS timestamptz) IS NULL OR {column} < CAST(:until AS timestamptz))"
)

_EXPORT_ORDER = {
    "time": "q.created_at, q.id",
    # Answers to the same question over the same collections come out next to each other.
    "question": "question_key, scope, q.created_at, q.id",
}


def export_rows(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    collection_id: uuid.UUID | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    by_query_time: bool = False,
    min_rating: int | None = None,
    max_rating: int | None = None,
    text_depth: int | None = None,
    order: str = "time",
    batch_size: int = 500,
) -> Iterator[ExportRow]:
    """The tenant's answers that have feedback, streamed from a server-side cursor in batches
    of `batch_size`; iterate while the session is open.

    `since` (inclusive) and `until` (exclusive) bound the feedback's time, or the answer's with
    `by_query_time` (then every feedback row of a chosen answer counts). With `text_depth`,
    chunk texts come along for the top `text_depth` retrieved, the cited and the judged chunks.
    `order`: "time" (answer time) or "question" (grouped by question and collections).
    """
    feedback_window = "TRUE" if by_query_time else _WINDOW.format(column="f.created_at")
    statement = _EXPORT_ROWS.format(
        texts="NULL::jsonb" if text_depth is None else _EXPORT_TEXTS,
        feedback_window=feedback_window,
        query_window=_WINDOW.format(column="q.created_at") if by_query_time else "TRUE",
        order=_EXPORT_ORDER[order],
    )
    params = {
        "tenant": tenant_id,
        "collection": collection_id,
        "since": since,
        "until": until,
        "min_rating": min_rating,
        "max_rating": max_rating,
        "depth": text_depth or 0,
    }
    result = session.execute(text(statement).execution_options(yield_per=batch_size), params)
    for row in result:
        yield _export_row(row)


def _export_row(row: Row[Any]) -> ExportRow:
    values = row._mapping
    citations = values["citations"] or ()
    return ExportRow(
        query_id=values["id"],
        question=values["question"],
        answer=values["answer"],
        status=values["status"],
        messages=values["messages"],
        ranked=tuple(uuid.UUID(item["chunk_id"]) for item in values["retrieved"] or ()),
        cited=tuple(uuid.UUID(i) for c in citations for i in c.get("chunk_ids", ())),
        collection_ids=tuple(values["scope"]),
        created_at=values["created_at"],
        feedback=tuple(_feedback_entry(entry) for entry in values["entries"]),
        chunk_texts={uuid.UUID(k): v for k, v in (values["texts"] or {}).items()},
        question_key=values["question_key"],
    )


def _feedback_entry(entry: dict[str, Any]) -> FeedbackEntry:
    return FeedbackEntry(
        rating=entry["rating"],
        scale=entry["scale"],
        corrected_answer=entry["corrected_answer"],
        relevant=tuple(uuid.UUID(i) for i in entry["relevant"] or ()),
        irrelevant=tuple(uuid.UUID(i) for i in entry["irrelevant"] or ()),
        created_at=datetime.fromisoformat(entry["created_at"]),
    )


# -- analysts --------------------------------------------------------------------------------

# The NOLOGIN role migration 0006 creates; it may read the views in schema `analytics` only.
ANALYST_GROUP = "ragservice_analyst"
ANALYST_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def _analyst_name(name: str) -> str:
    if not ANALYST_NAME.fullmatch(name):
        raise InvalidInputError(
            f"{name!r} is not a valid analyst name: lowercase letters, digits and _, "
            "starting with a letter or _, at most 63 characters"
        )
    return name


def create_analyst(session: Session, name: str, password: str) -> None:
    """A LOGIN role in `ragservice_analyst`. Roles are server-wide: one role reaches the
    analytics views of every database on the server that granted them."""
    _analyst_name(name)
    conn = _driver_connection(session)
    if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ANALYST_GROUP,)).fetchone():
        raise ConfigurationError(
            f"role {ANALYST_GROUP} is missing: migration 0006 could not create it (the database "
            "user may not create roles); see docs/analysts.md for the statements to run as an "
            "administrator"
        )
    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
        raise ConflictError(f"a role named {name!r} already exists")
    conn.execute(
        psycopg.sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {}").format(
            psycopg.sql.Identifier(name),
            psycopg.sql.Literal(password),
            psycopg.sql.Identifier(ANALYST_GROUP),
        )
    )


def list_analysts(session: Session) -> list[tuple[str, bool]]:
    """(name, can log in) for each member of `ragservice_analyst`, by name."""
    rows = session.execute(
        text(
            "SELECT r.rolname, r.rolcanlogin FROM pg_roles r "
            "JOIN pg_auth_members m ON m.member = r.oid "
            "JOIN pg_roles g ON g.oid = m.roleid "
            "WHERE g.rolname = :group ORDER BY r.rolname"
        ),
        {"group": ANALYST_GROUP},
    ).all()
    return [(str(name), bool(login)) for name, login in rows]


def remove_analyst(session: Session, name: str) -> bool:
    """Drop an analyst's role; False when no member of `ragservice_analyst` has that name (other
    roles are never dropped here)."""
    _analyst_name(name)
    if name not in {analyst for analyst, _ in list_analysts(session)}:
        return False
    _driver_connection(session).execute(
        psycopg.sql.SQL("DROP ROLE {}").format(psycopg.sql.Identifier(name))
    )
    return True
