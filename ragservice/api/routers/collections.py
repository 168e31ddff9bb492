"""Collections: create, list, get, delete."""

from __future__ import annotations

import uuid
from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from ragservice import store
from ragservice.api.deps import Admin, Reader, RuntimeDep, Writer, audit, collection_id
from ragservice.api.schemas.collections import (
    MAX_CACHE_ENTRIES_PAGE,
    CacheEntries,
    CacheEntryOut,
    CacheStats,
    CollectionCreate,
    CollectionList,
    CollectionOut,
    CollectionUpdate,
    collection_out,
)
from ragservice.api.schemas.common import error_responses
from ragservice.runtime import Runtime

router = APIRouter(prefix="/v1/collections", tags=["collections"], responses=error_responses(409))


@router.post("", status_code=status.HTTP_201_CREATED)
def create_collection(
    body: CollectionCreate, principal: Writer, runtime: RuntimeDep
) -> CollectionOut:
    """Create a collection; 409 when the name is taken."""
    with runtime.db.write() as session:
        store.collections.create_collection(
            session,
            principal.tenant_id,
            body.name,
            description=body.description,
            metadata=body.metadata,
            cache_ttl_seconds=body.cache_ttl_seconds,
            flagged_chunks=body.flagged_chunks,
        )
    return _get(runtime, principal.tenant_id, body.name)


@router.get("")
def list_collections(principal: Reader, runtime: RuntimeDep) -> CollectionList:
    with runtime.db.read() as session:
        found = store.collections.list_collections(session, principal.tenant_id)
    return CollectionList(collections=[collection_out(info) for info in found])


@router.get("/{name}")
def get_collection(name: str, principal: Reader, runtime: RuntimeDep) -> CollectionOut:
    return _get(runtime, principal.tenant_id, name)


@router.patch("/{name}")
def update_collection(
    name: str, body: CollectionUpdate, principal: Admin, runtime: RuntimeDep
) -> CollectionOut:
    """Change the lifetime of the collection's cached answers (new entries only) and what
    search does with its flagged chunks (from the next search on); both in one transaction."""
    given = body.model_fields_set
    with runtime.db.write() as session:
        found = store.collections.find_collection_id(session, principal.tenant_id, name)
        if found is None:
            raise store.collections.collection_not_found(name)
        if "cache_ttl_seconds" in given:
            store.collections.set_collection_cache_ttl(
                session, principal.tenant_id, name, body.cache_ttl_seconds
            )
        if body.flagged_chunks is not None:
            store.collections.set_collection_flagged_chunks(
                session, principal.tenant_id, name, body.flagged_chunks
            )
        audit(
            session,
            principal,
            "collection.update",
            name,
            {field: getattr(body, field) for field in sorted(given)},
        )
    return _get(runtime, principal.tenant_id, name)


@router.get("/{name}/cache")
def cache_stats(name: str, principal: Admin, runtime: RuntimeDep) -> CacheStats:
    """The prompt cache's entries, size and hit rate for this collection."""
    cid = collection_id(runtime, principal.tenant_id, name)
    with runtime.db.read() as session:
        return CacheStats(**store.prompt_cache.cache_stats(session, principal.tenant_id, cid))


@router.get("/{name}/cache/entries")
def cache_entries(
    name: str,
    principal: Admin,
    runtime: RuntimeDep,
    limit: Annotated[int, Query(ge=1, le=MAX_CACHE_ENTRIES_PAGE)] = 50,
) -> CacheEntries:
    """The collection's live cached answers, newest first: the question, the answer, its hits
    and expiry. Entries of a question over several collections show under each of them."""
    cid = collection_id(runtime, principal.tenant_id, name)
    with runtime.db.read() as session:
        entries = store.prompt_cache.list_cache_entries(
            session, principal.tenant_id, cid, limit=limit
        )
        info = store.collections.get_collection(session, principal.tenant_id, name)
    return CacheEntries(
        entries=[CacheEntryOut(**asdict(entry)) for entry in entries],
        ttl_seconds=None if info is None else info.cache_ttl_seconds,
        default_ttl_seconds=runtime.settings.cache_ttl_seconds,
    )


@router.delete("/{name}/cache")
def purge_cache(name: str, principal: Admin, runtime: RuntimeDep) -> dict[str, int]:
    """Delete every cached answer that covers this collection."""
    cid = collection_id(runtime, principal.tenant_id, name)
    with runtime.db.write() as session:
        purged = store.prompt_cache.purge_cache(session, principal.tenant_id, cid)
        audit(session, principal, "cache.purge", name, {"purged": purged})
    return {"purged": purged}


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT)
def delete_collection(name: str, principal: Admin, runtime: RuntimeDep) -> Response:
    """Delete a collection with all its documents, chunks, embeddings and jobs."""
    with runtime.db.write() as session:
        if not store.collections.delete_collection(session, principal.tenant_id, name):
            raise store.collections.collection_not_found(name)
        audit(session, principal, "collection.delete", name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


def _get(runtime: Runtime, tenant_id: uuid.UUID, name: str) -> CollectionOut:
    with runtime.db.read() as session:
        info = store.collections.get_collection(session, tenant_id, name)
    if info is None:
        raise store.collections.collection_not_found(name)
    return collection_out(info)
