"""Collections: create, update, read, and the prompt cache's statistics for one."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ragservice import store
from ragservice.api.schemas.common import JsonObject

COLLECTION_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
MAX_TTL_SECONDS = 2**31 - 1  # the column is a PostgreSQL integer


class CollectionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=COLLECTION_NAME, description="letters, digits, . _ -; unique")
    description: str | None = Field(default=None, max_length=2000)
    metadata: JsonObject = Field(default_factory=dict)
    cache_ttl_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TTL_SECONDS,
        description="lifetime of cached answers; unset: the service default",
    )


class CollectionUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cache_ttl_seconds: int | None = Field(
        ge=1,
        le=MAX_TTL_SECONDS,
        description="lifetime of cached answers; null: the service default",
    )


class CacheStats(BaseModel):
    entries: int = Field(description="live (unexpired) entries covering the collection")
    bytes: int
    entry_hits: int = Field(description="hits served by the live entries")
    queries: int = Field(description="questions logged on the collection")
    cache_hits: int
    hit_rate: float


class CollectionOut(BaseModel):
    id: uuid.UUID
    name: str
    description: str | None
    metadata: dict[str, Any]
    document_count: int
    chunk_count: int
    cache_ttl_seconds: int | None
    created_at: datetime


class CollectionList(BaseModel):
    collections: list[CollectionOut]


def collection_out(info: store.collections.CollectionInfo) -> CollectionOut:
    return CollectionOut(
        id=info.id,
        name=info.name,
        description=info.description,
        metadata=info.metadata,
        document_count=info.document_count,
        chunk_count=info.chunk_count,
        cache_ttl_seconds=info.cache_ttl_seconds,
        created_at=info.created_at,
    )
