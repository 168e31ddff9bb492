"""Collections: create, list, get, delete."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from ragservice.api.deps import Admin, DatabaseDep, Reader, SettingsDep, Writer
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
from ragservice.services import collections
from ragservice.services.collections import CollectionChanges, NewCollection

router = APIRouter(prefix="/v1/collections", tags=["collections"], responses=error_responses(409))


@router.post("", status_code=status.HTTP_201_CREATED)
def create_collection(body: CollectionCreate, principal: Writer, db: DatabaseDep) -> CollectionOut:
    """Create a collection; 409 when the name is taken."""
    new = NewCollection(
        name=body.name,
        description=body.description,
        metadata=body.metadata,
        cache_ttl_seconds=body.cache_ttl_seconds,
        flagged_chunks=body.flagged_chunks,
    )
    return collection_out(collections.create_collection(db, principal.tenant_id, new))


@router.get("")
def list_collections(principal: Reader, db: DatabaseDep) -> CollectionList:
    found = collections.list_collections(db, principal.tenant_id)
    return CollectionList(collections=[collection_out(info) for info in found])


@router.get("/{name}")
def get_collection(name: str, principal: Reader, db: DatabaseDep) -> CollectionOut:
    return collection_out(collections.get_collection(db, principal.tenant_id, name))


@router.patch("/{name}")
def update_collection(
    name: str, body: CollectionUpdate, principal: Admin, db: DatabaseDep
) -> CollectionOut:
    """Change the lifetime of the collection's cached answers (new entries only) and what
    search does with its flagged chunks (from the next search on); both in one transaction."""
    changes = CollectionChanges(
        given=frozenset(body.model_fields_set),
        cache_ttl_seconds=body.cache_ttl_seconds,
        flagged_chunks=body.flagged_chunks,
    )
    return collection_out(collections.update_collection(db, principal, name, changes))


@router.get("/{name}/cache")
def cache_stats(name: str, principal: Admin, db: DatabaseDep) -> CacheStats:
    """The prompt cache's entries, size and hit rate for this collection."""
    return CacheStats(**collections.cache_stats(db, principal.tenant_id, name))


@router.get("/{name}/cache/entries")
def cache_entries(
    name: str,
    principal: Admin,
    db: DatabaseDep,
    settings: SettingsDep,
    limit: Annotated[int, Query(ge=1, le=MAX_CACHE_ENTRIES_PAGE)] = 50,
) -> CacheEntries:
    """The collection's live cached answers, newest first: the question, the answer, its hits
    and expiry. Entries of a question over several collections show under each of them."""
    listing = collections.cache_entries(db, principal.tenant_id, name, limit=limit)
    return CacheEntries(
        entries=[CacheEntryOut(**asdict(entry)) for entry in listing.entries],
        ttl_seconds=listing.ttl_seconds,
        default_ttl_seconds=settings.cache.ttl_seconds,
    )


@router.delete("/{name}/cache")
def purge_cache(name: str, principal: Admin, db: DatabaseDep) -> dict[str, int]:
    """Delete every cached answer that covers this collection."""
    return {"purged": collections.purge_cache(db, principal, name)}


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT)
def delete_collection(name: str, principal: Admin, db: DatabaseDep) -> Response:
    """Delete a collection with all its documents, chunks, embeddings and jobs."""
    collections.delete_collection(db, principal, name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
