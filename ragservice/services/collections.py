"""A tenant's collections: created, listed, read, their settings changed, deleted; and the
prompt cache's entries that cover one, read or purged. Changes an admin makes are audited in
their own transaction."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from ragservice import store
from ragservice.db import Database
from ragservice.errors import PermissionDeniedError
from ragservice.services.callers import Caller, audit
from ragservice.store.collections import CollectionInfo
from ragservice.store.prompt_cache import CacheEntryInfo


@dataclass(frozen=True)
class NewCollection:
    name: str
    description: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    cache_ttl_seconds: int | None = None
    """None: the service's default."""
    flagged_chunks: str = "downweight"


@dataclass(frozen=True)
class CollectionChanges:
    """The settings to change; a field left out (not in `given`) stays as it is."""

    given: frozenset[str]
    cache_ttl_seconds: int | None = None
    """None (when given): back to the service's default."""
    flagged_chunks: str | None = None

    def audited(self) -> dict[str, Any]:
        """The changes as the audit log records them."""
        return {name: getattr(self, name) for name in sorted(self.given)}


@dataclass(frozen=True)
class CacheListing:
    entries: list[CacheEntryInfo]
    """Newest first."""
    ttl_seconds: int | None
    """The collection's lifetime of new entries; None: the service's default."""


def create_collection(db: Database, tenant_id: uuid.UUID, new: NewCollection) -> CollectionInfo:
    """Create the collection; ConflictError when the tenant has one of that name."""
    with db.write() as session:
        store.collections.create_collection(
            session,
            tenant_id,
            new.name,
            description=new.description,
            metadata=new.metadata,
            cache_ttl_seconds=new.cache_ttl_seconds,
            flagged_chunks=new.flagged_chunks,
        )
    return get_collection(db, tenant_id, new.name)


def collection_names(db: Database, tenant_id: uuid.UUID) -> list[str]:
    """The names of the tenant's collections, sorted."""
    with db.read() as session:
        return sorted(store.collections.collection_ids(session, tenant_id, None))


def list_collections(db: Database, tenant_id: uuid.UUID) -> list[CollectionInfo]:
    with db.read() as session:
        return store.collections.list_collections(session, tenant_id)


def get_collection(db: Database, tenant_id: uuid.UUID, name: str) -> CollectionInfo:
    """The collection with its counts; NotFoundError for a name the tenant does not have."""
    with db.read() as session:
        info = store.collections.get_collection(session, tenant_id, name)
    if info is None:
        raise store.collections.collection_not_found(name)
    return info


def update_collection(
    db: Database, caller: Caller, name: str, changes: CollectionChanges
) -> CollectionInfo:
    """Change the lifetime of the collection's cached answers (new entries only) and what
    search does with its flagged chunks, in one transaction with the audit entry."""
    tenant_id = caller.tenant_id
    with db.write() as session:
        if store.collections.find_collection_id(session, tenant_id, name) is None:
            raise store.collections.collection_not_found(name)
        if "cache_ttl_seconds" in changes.given:
            store.collections.set_collection_cache_ttl(
                session, tenant_id, name, changes.cache_ttl_seconds
            )
        if changes.flagged_chunks is not None:
            store.collections.set_collection_flagged_chunks(
                session, tenant_id, name, changes.flagged_chunks
            )
        audit(session, caller, "collection.update", name, changes.audited())
    return get_collection(db, tenant_id, name)


def delete_collection(db: Database, caller: Caller, name: str) -> None:
    """Delete the collection with all its documents, chunks, embeddings and jobs.
    PermissionDeniedError when it holds documents the caller may not read (an admin key of a
    user): those are deleted only by one who may read them all."""
    with db.write() as session:
        if store.collections.holds_hidden_documents(session, caller.tenant_id, name):
            raise PermissionDeniedError(
                f"collection {name!r} holds documents you may not read; it can be deleted "
                "by an admin who may read every document (a key of no user)"
            )
        if not store.collections.delete_collection(session, caller.tenant_id, name):
            raise store.collections.collection_not_found(name)
        audit(session, caller, "collection.delete", name)


def cache_stats(db: Database, tenant_id: uuid.UUID, name: str) -> dict[str, Any]:
    """The prompt cache's entries, bytes, hits and hit rate for the collection."""
    with db.read() as session:
        cid = store.collections.require_collection_id(session, tenant_id, name)
        return store.prompt_cache.cache_stats(session, tenant_id, cid)


def cache_entries(db: Database, tenant_id: uuid.UUID, name: str, *, limit: int) -> CacheListing:
    """The collection's live cached answers, newest first, at most `limit`. Entries of a
    question over several collections are listed under each of them."""
    with db.read() as session:
        cid = store.collections.require_collection_id(session, tenant_id, name)
        entries = store.prompt_cache.list_cache_entries(session, tenant_id, cid, limit=limit)
        info = store.collections.get_collection(session, tenant_id, name)
    return CacheListing(entries, None if info is None else info.cache_ttl_seconds)


def purge_cache(db: Database, caller: Caller, name: str) -> int:
    """Delete every cached answer of the caller's tenant that covers the collection; how many."""
    with db.write() as session:
        cid = store.collections.require_collection_id(session, caller.tenant_id, name)
        purged = store.prompt_cache.purge_cache(session, caller.tenant_id, cid)
        audit(session, caller, "cache.purge", name, {"purged": purged})
    return purged
