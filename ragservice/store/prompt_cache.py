"""The prompt cache's rows: exact and nearest lookups, stores, stats and purges.

An entry is visible (to lookups, listings, stats) only to a transaction that may read every
document it was built from (`source_documents`; row-level security, migration 0026): an answer
cached for one asker is served to another only if that one may read all its sources. Lookups
also ask that the entry was built for an asker who reads at least what this one reads
(`built_for`): every document, or a principal set that holds this asker's. Then this asker's own
search would have found the very same sources (they are the best of a larger set, and this asker
may read them all), so the answer is the one it would get afresh, not a narrower one."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from sqlalchemy import delete, func, select, text, update
from sqlalchemy.orm import Session

from ragservice.db import tenancy
from ragservice.db.engine import driver_connection
from ragservice.db.models import Collection, Document, PromptCacheEntry
from ragservice.readers import listable


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


# Entries built for an asker who reads at least what the current one reads: every document, or
# a principal set that holds the current one's (which then does not read every document).
_SERVED_HERE = "(built_for = '{*}' OR (NOT %(reads_all)s AND built_for @> %(readers)s::text[]))"

_CACHE_EXACT = """
SELECT id, prompt, response FROM prompt_cache
WHERE scope = %(scope)s AND prompt_hash = %(prompt_hash)s AND expires_at > now() AND {served}
ORDER BY created_at DESC, id
LIMIT 1
"""

_CACHE_NEAREST = """
WITH nearest AS MATERIALIZED (
    SELECT id, prompt, response, embedding::vector({dim}) <=> %(vector)s::vector({dim}) AS distance
    FROM prompt_cache
    WHERE model_id = {model_id} AND scope = %(scope)s AND expires_at > now()
      AND {served}
    ORDER BY distance
    LIMIT %(limit)s
)
SELECT id, prompt, response, 1 - distance FROM nearest
WHERE 1 - distance >= %(threshold)s ORDER BY distance, id
"""

_CACHE_INSERT = """
INSERT INTO prompt_cache AS p (tenant_id, scope, model_id, collection_ids, prompt_hash, prompt,
                               embedding, answer, response, expires_at, source_documents,
                               built_for)
VALUES (%(tenant_id)s, %(scope)s, %(model_id)s, %(collection_ids)s, %(prompt_hash)s, %(prompt)s,
        %(embedding)s, %(answer)s, %(response)s, now() + make_interval(secs => %(ttl)s),
        %(sources)s::uuid[], %(built_for)s::text[])
ON CONFLICT (scope, prompt_hash, source_documents, built_for, tenant_id) DO {conflict}
RETURNING id
"""

_CACHE_REPLACE = """UPDATE SET prompt = EXCLUDED.prompt, embedding = EXCLUDED.embedding,
    answer = EXCLUDED.answer, response = EXCLUDED.response, created_at = EXCLUDED.created_at,
    source_documents = EXCLUDED.source_documents,
    expires_at = EXCLUDED.expires_at, hits = 0, last_hit_at = NULL"""


def built_for() -> list[str]:
    """The current asker's principal set as entries keep it (`*`: every document)."""
    readers = tenancy.current().readers
    return [tenancy.ALL_DOCUMENTS] if readers is None else listable(readers)


def _served_params() -> dict[str, Any]:
    mine = built_for()
    return {"reads_all": mine == [tenancy.ALL_DOCUMENTS], "readers": mine}


def _with_served(statement: str, **literals: int) -> psycopg.sql.Composed:
    return psycopg.sql.SQL(statement).format(
        served=psycopg.sql.SQL(_SERVED_HERE),
        **{name: psycopg.sql.Literal(value) for name, value in literals.items()},
    )


def cache_exact(session: Session, scope: str, prompt_hash: str) -> CachedEntry | None:
    """The entry of the question, if the current asker may be served it: several when askers
    who read different documents asked, the newest of those it may be served."""
    params = {"scope": scope, "prompt_hash": prompt_hash, **_served_params()}
    row = driver_connection(session).execute(_with_served(_CACHE_EXACT), params).fetchone()
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
    conn = driver_connection(session)
    # The scope filter is selective: iterative scans keep reading the index until rows pass.
    conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
    query = _with_served(_CACHE_NEAREST, dim=int(dimension), model_id=int(model_id))
    params = {
        "vector": vector,
        "scope": scope,
        "limit": limit,
        "threshold": threshold,
        **_served_params(),
    }
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
    if not _sources_current(session, entry.tenant_id, entry.sources):
        return None
    conn = driver_connection(session)
    # An expired entry that the purger has not reached yet is replaced like a refreshed one.
    # The new row's created_at is now(), which Citus cannot evaluate in a conflict clause.
    conflict = (
        _CACHE_REPLACE if replace else _CACHE_REPLACE + " WHERE p.expires_at <= EXCLUDED.created_at"
    )
    statement = _CACHE_INSERT.format(conflict=conflict)
    row = conn.execute(statement, _cache_params(entry)).fetchone()
    if row is None:  # an identical miss was stored first by someone else
        return None
    entry_id: uuid.UUID = row[0]
    conn.execute(
        "DELETE FROM prompt_cache_sources WHERE entry_id = %s AND tenant_id = %s",
        (entry_id, entry.tenant_id),
    )
    # RETURNING: on Citus an INSERT ... SELECT without it is a COPY into the shard, which row-
    # level security refuses (see store.bulk).
    conn.execute(
        "INSERT INTO prompt_cache_sources (entry_id, tenant_id, document_id, document_version) "
        "SELECT %s::uuid, %s::uuid, unnest(%s::uuid[]), unnest(%s::int[]) RETURNING entry_id",
        (entry_id, entry.tenant_id, list(entry.sources), list(entry.sources.values())),
    )
    return entry_id


def _sources_current(session: Session, tenant_id: uuid.UUID, sources: dict[uuid.UUID, int]) -> bool:
    if not sources:
        return True
    # A fixed lock order, and a bounded wait: never a deadlock with an ingest batch.
    session.execute(text("SET LOCAL lock_timeout = '2s'"))
    rows = session.execute(
        select(Document.id, Document.version)
        .where(Document.tenant_id == tenant_id, Document.id.in_(list(sources)))
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
        "sources": sorted(entry.sources),
        "built_for": built_for(),
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


@dataclass(frozen=True, slots=True)
class CacheEntryInfo:
    """A live cache entry as an admin sees it (its vector and scope hash left out)."""

    id: uuid.UUID
    question: str
    answer: str
    model: str | None
    created_at: datetime
    expires_at: datetime
    hits: int
    last_hit_at: datetime | None
    bytes: int


_CACHE_ENTRIES = text(
    "SELECT id, coalesce(response ->> 'question', prompt), answer, response ->> 'model', "
    "created_at, expires_at, hits, last_hit_at, pg_column_size(c.*) "
    "FROM prompt_cache c WHERE tenant_id = :t AND :c = ANY(collection_ids) "
    "AND expires_at > now() ORDER BY created_at DESC, id DESC LIMIT :limit"
)


def list_cache_entries(
    session: Session, tenant_id: uuid.UUID, collection_id: uuid.UUID, *, limit: int
) -> list[CacheEntryInfo]:
    """The live entries of the tenant that cover the collection, newest first (the same ones
    `cache_stats` counts), at most `limit`."""
    rows = session.execute(_CACHE_ENTRIES, {"t": tenant_id, "c": collection_id, "limit": limit})
    return [CacheEntryInfo(*row) for row in rows]


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
