"""Search: the request, and the hits with the model the search ran with."""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ragservice.api.schemas.common import JsonObject, Pages, pages_out
from ragservice.embedding.registry import ServingModel
from ragservice.retrieval.search import Mode, SearchHit


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1)
    collections: list[str] | None = Field(
        default=None, min_length=1, description="collection names; unset: all of yours"
    )
    mode: Mode = Mode.HYBRID
    k: int = Field(default=10, ge=1)
    filters: JsonObject | None = Field(
        default=None,
        description='metadata filters, e.g. {"year": {"$gte": 2020}, "chunk.heading": "Intro"}',
    )


class DocumentRef(BaseModel):
    id: uuid.UUID
    external_id: str
    title: str | None
    metadata: dict[str, Any]


class SearchHitOut(BaseModel):
    chunk_id: uuid.UUID
    score: float = Field(
        description="dense: cosine similarity; fulltext: BM25; hybrid: reciprocal rank fusion"
    )
    text: str
    ordinal: int
    start_char: int
    end_char: int
    pages: Pages = None
    metadata: dict[str, Any]
    collection: str
    document: DocumentRef
    flagged: bool = Field(
        description="the chunk reads like instructions to a model (flagged at ingest; its "
        "collection's `flagged_chunks` decides whether it is marked, downweighted or dropped)"
    )
    flag_reasons: list[str] = Field(description="the detector's rules that matched")


class EmbeddingModelOut(BaseModel):
    """The embedding model a search ran with (the one being served when it started)."""

    id: int
    name: str
    version: int


class SearchResponse(BaseModel):
    mode: Mode
    results: list[SearchHitOut]
    timings_ms: dict[str, float]
    embedding_model: EmbeddingModelOut | None = None


def embedding_model_out(model: ServingModel) -> EmbeddingModelOut:
    return EmbeddingModelOut(id=model.id, name=model.name, version=model.version)


def hit_out(hit: SearchHit) -> SearchHitOut:
    return SearchHitOut(
        chunk_id=hit.chunk_id,
        score=hit.score,
        text=hit.text,
        ordinal=hit.ordinal,
        start_char=hit.start_char,
        end_char=hit.end_char,
        pages=pages_out(hit.pages),
        metadata=hit.chunk_metadata,
        collection=hit.collection,
        flagged=hit.flagged,
        flag_reasons=list(hit.injection),
        document=DocumentRef(
            id=hit.document_id,
            external_id=hit.external_id,
            title=hit.title,
            metadata=hit.document_metadata,
        ),
    )
