"""Collections of a tenant."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Label, Row, Select, and_, delete, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from ragservice.db import tenancy
from ragservice.db.engine import driver_connection
from ragservice.db.models import Collection, CollectionTextStats, Document, IngestJob
from ragservice.errors import ConflictError, NotFoundError


def ensure_collection(session: Session, tenant_id: uuid.UUID, name: str) -> uuid.UUID:
    """The id of the tenant's collection `name`, created if it does not exist."""
    stmt = (
        insert(Collection)
        .values(tenant_id=tenant_id, name=name)
        .on_conflict_do_nothing(index_elements=["tenant_id", "name"])
    )
    session.execute(stmt)
    found = find_collection_id(session, tenant_id, name)
    assert found is not None  # inserted above or already there
    return found


def find_collection_id(session: Session, tenant_id: uuid.UUID, name: str) -> uuid.UUID | None:
    """The id of the tenant's collection `name`; None when the tenant has none of that name."""
    stmt = select(Collection.id).where(Collection.tenant_id == tenant_id, Collection.name == name)
    return session.scalar(stmt)


def require_collection_id(session: Session, tenant_id: uuid.UUID, name: str) -> uuid.UUID:
    """The id of the tenant's collection `name`; NotFoundError when there is none (another
    tenant's collection of that name is as missing as one that does not exist)."""
    found = find_collection_id(session, tenant_id, name)
    if found is None:
        raise collection_not_found(name)
    return found


def require_collection_ids(
    session: Session, tenant_id: uuid.UUID, names: Sequence[str] | None
) -> list[uuid.UUID]:
    """Ids of the tenant's collections by name (all of them for None), in the order given;
    NotFoundError naming the first missing one."""
    found = collection_ids(session, tenant_id, names)
    if names is None:
        return list(found.values())
    missing = sorted(set(names) - set(found))
    if missing:
        raise collection_not_found(missing[0])
    return [found[name] for name in dict.fromkeys(names)]


def collection_not_found(name: str) -> NotFoundError:
    return NotFoundError(f"collection {name!r} not found")


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
    flagged_chunks: str = "downweight"


FLAGGED_CHUNK_POLICIES = ("mark", "downweight", "drop")


def create_collection(
    session: Session,
    tenant_id: uuid.UUID,
    name: str,
    *,
    description: str | None = None,
    metadata: dict[str, Any] | None = None,
    cache_ttl_seconds: int | None = None,
    flagged_chunks: str | None = None,
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
            flagged_chunks=flagged_chunks or "downweight",
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


def set_collection_flagged_chunks(
    session: Session, tenant_id: uuid.UUID, name: str, policy: str
) -> bool:
    """What search does with the collection's flagged chunks: mark, downweight or drop."""
    stmt = (
        update(Collection)
        .where(Collection.tenant_id == tenant_id, Collection.name == name)
        .values(flagged_chunks=policy, updated_at=func.now())
    )
    return bool(session.execute(stmt).rowcount)  # type: ignore[attr-defined]


def holds_hidden_documents(session: Session, tenant_id: uuid.UUID, name: str) -> bool:
    """Whether the collection holds documents the transaction's asker may not read."""
    if not tenancy.current().restricted:
        return False
    count = (
        select(func.count())
        .select_from(Document)
        .join(
            Collection,
            and_(
                Collection.id == Document.collection_id,
                Collection.tenant_id == Document.tenant_id,
            ),
        )
        .where(Collection.tenant_id == tenant_id, Collection.name == name)
    )
    visible = session.scalar(count) or 0
    with tenancy.reading_every_document(driver_connection(session)):
        every = session.scalar(count) or 0
    return every > visible


def delete_collection(session: Session, tenant_id: uuid.UUID, name: str) -> bool:
    """Delete a collection with its documents, chunks and embeddings (cascades) and its jobs
    (here: on a distributed store the jobs stay on the coordinator, where no foreign key
    reaches the collections; docs/scaling.md)."""
    collection_id = session.scalar(
        select(Collection.id).where(Collection.tenant_id == tenant_id, Collection.name == name)
    )
    if collection_id is None:
        return False
    session.execute(
        delete(IngestJob).where(
            IngestJob.tenant_id == tenant_id, IngestJob.collection_id == collection_id
        )
    )
    stmt = delete(Collection).where(
        Collection.tenant_id == tenant_id, Collection.id == collection_id
    )
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
    # Each subquery names the tenant too, not only the outer query: a Citus coordinator then
    # runs the whole statement on the tenant's worker alone (docs/scaling.md).
    documents = (
        select(func.count())
        .where(Document.collection_id == Collection.id, Document.tenant_id == tenant_id)
        .scalar_subquery()
        .label("document_count")
    )
    return (
        select(Collection, documents, _chunk_count(tenant_id))
        .where(Collection.tenant_id == tenant_id)
        .order_by(Collection.name)
    )


def _chunk_count(tenant_id: uuid.UUID) -> Label[int]:
    """The collection's chunks: its text statistics' total, which counts every document's
    chunks; for a transaction that may not read every document, the chunks of those it may
    read (the documents' own counts, under row-level security)."""
    if tenancy.current().restricted:
        total = select(func.coalesce(func.sum(Document.chunk_count), 0)).where(
            Document.collection_id == Collection.id, Document.tenant_id == tenant_id
        )
    else:
        total = select(func.coalesce(func.sum(CollectionTextStats.chunk_count), 0)).where(
            CollectionTextStats.collection_id == Collection.id,
            CollectionTextStats.tenant_id == tenant_id,
        )
    return total.scalar_subquery().label("chunk_count")


def _collection_info(row: Row[Any]) -> CollectionInfo:
    collection: Collection = row[0]
    return CollectionInfo(
        id=collection.id,
        name=collection.name,
        description=collection.description,
        metadata=collection.metadata_,
        created_at=collection.created_at,
        cache_ttl_seconds=collection.cache_ttl_seconds,
        flagged_chunks=collection.flagged_chunks,
        document_count=int(row.document_count or 0),
        chunk_count=int(row.chunk_count or 0),
    )
