"""Collections: create, update, read, and the prompt cache's statistics for one."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from ragservice import store
from ragservice.api.schemas.common import JsonObject, Storable, Text
from ragservice.limits.shape import MAX_INT4

COLLECTION_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
MAX_TTL_SECONDS = MAX_INT4  # the column is a PostgreSQL integer

FlaggedChunks = Literal["mark", "downweight", "drop"]
FLAGGED_CHUNKS_DESCRIPTION = (
    "what search and answers do with chunks flagged as instruction-like at ingest: `mark` "
    "(kept in rank, flagged), `downweight` (flagged, half the score), `drop` (never returned)"
)


class CollectionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Text = Field(pattern=COLLECTION_NAME, description="letters, digits, . _ -; unique")
    description: Annotated[str, StringConstraints(max_length=2000), Storable] | None = None
    metadata: JsonObject = Field(default_factory=dict)
    cache_ttl_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TTL_SECONDS,
        description="lifetime of cached answers; unset: the service default",
    )
    flagged_chunks: FlaggedChunks = Field(
        default="downweight", description=FLAGGED_CHUNKS_DESCRIPTION
    )


class CollectionUpdate(BaseModel):
    """The fields given are changed; the others are left as they are."""

    model_config = ConfigDict(extra="forbid")

    cache_ttl_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TTL_SECONDS,
        description="lifetime of cached answers; null: the service default",
    )
    flagged_chunks: FlaggedChunks | None = Field(
        default=None, description=FLAGGED_CHUNKS_DESCRIPTION
    )

    @model_validator(mode="after")
    def _something_to_change(self) -> CollectionUpdate:
        if not self.model_fields_set:
            raise ValueError("give cache_ttl_seconds, flagged_chunks or both")
        if "flagged_chunks" in self.model_fields_set and self.flagged_chunks is None:
            raise ValueError("flagged_chunks must be one of mark, downweight, drop")
        return self


class CacheStats(BaseModel):
    entries: int = Field(description="live (unexpired) entries covering the collection")
    bytes: int
    entry_hits: int = Field(description="hits served by the live entries")
    queries: int = Field(description="questions logged on the collection")
    cache_hits: int
    hit_rate: float


MAX_CACHE_ENTRIES_PAGE = 200


class CacheEntryOut(BaseModel):
    id: uuid.UUID
    question: str = Field(description="the question as it was asked when the answer was cached")
    answer: str
    model: str | None = Field(description="the upstream model that answered, or `extractive`")
    created_at: datetime
    expires_at: datetime = Field(description="it is not served after this")
    hits: int = Field(description="times it was served")
    last_hit_at: datetime | None
    bytes: int = Field(description="its size in the database, vector included")


class CacheEntries(BaseModel):
    entries: list[CacheEntryOut] = Field(description="newest first")
    ttl_seconds: int | None = Field(
        description="the collection's cache lifetime; null: the server's default applies"
    )
    default_ttl_seconds: int = Field(description="the server's (RAGSERVICE_CACHE_TTL_SECONDS)")


class CollectionOut(BaseModel):
    id: uuid.UUID
    name: str
    description: str | None
    metadata: dict[str, Any]
    document_count: int
    chunk_count: int
    cache_ttl_seconds: int | None
    flagged_chunks: FlaggedChunks = Field(description=FLAGGED_CHUNKS_DESCRIPTION)
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
        flagged_chunks=cast(FlaggedChunks, info.flagged_chunks),
        created_at=info.created_at,
    )
