"""Search: the request, and the hits with the model the search ran with."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ragservice.api.schemas.common import (
    CollectionNames,
    Finite,
    JsonObject,
    Pages,
    Text,
    pages_out,
)
from ragservice.config import Settings
from ragservice.embedding.registry import ServingModel
from ragservice.retrieval.filters import CompiledFilter
from ragservice.retrieval.fusion import Fusion
from ragservice.retrieval.options import MAX_PRF_DOCS, MAX_PRF_TERMS
from ragservice.retrieval.search import Mode, SearchHit, SearchOptions


class Ranking(BaseModel):
    """Per-request ranking settings over the server's (`RAGSERVICE_SEARCH_...`): they change
    only how the caller's own candidates are ordered, within the same bounds as the settings."""

    model_config = ConfigDict(extra="forbid")

    fusion: Fusion | None = Field(default=None, description="hybrid: rrf, minmax, zscore, dbsf")
    rrf_k: int | None = Field(default=None, ge=1, le=1000)
    text_weight: Finite | None = Field(default=None, ge=0, le=1)
    adaptive_weight: bool | None = None
    prf: Literal["off", "rm3"] | None = None
    prf_docs: int | None = Field(default=None, ge=1, le=MAX_PRF_DOCS)
    prf_terms: int | None = Field(default=None, ge=1, le=MAX_PRF_TERMS)
    prf_query_weight: Finite | None = Field(default=None, ge=0, le=1)
    document_share: Finite | None = Field(default=None, ge=0, le=1)
    bm25_k1: Finite | None = Field(default=None, ge=0, le=10)
    bm25_b: Finite | None = Field(default=None, ge=0, le=1)

    def apply(self, options: SearchOptions) -> SearchOptions:
        given = self.model_dump(exclude_none=True)
        if "prf" in given:
            given["prf"] = given["prf"] == "rm3"
        return replace(options, **given)


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: Text = Field(min_length=1)
    collections: CollectionNames | None = None
    mode: Mode = Mode.HYBRID
    k: int = Field(default=10, ge=1)
    filters: JsonObject | None = Field(
        default=None,
        description='metadata filters, e.g. {"year": {"$gte": 2020}, "chunk.heading": "Intro"}',
    )
    group_by: Literal["chunk", "document"] = Field(
        default="chunk",
        description="document: one result per document (its best chunk), k documents ranked "
        "by their chunks' scores",
    )
    ranking: Ranking | None = Field(default=None, description="ranking settings for this search")

    def options(self, settings: Settings, filters: CompiledFilter | None) -> SearchOptions:
        options = SearchOptions.from_settings(settings, mode=self.mode, k=self.k, filters=filters)
        if self.ranking is not None:
            options = self.ranking.apply(options)
        return replace(options, group_documents=self.group_by == "document")


class DocumentRef(BaseModel):
    id: uuid.UUID
    external_id: str
    title: str | None
    metadata: dict[str, Any]


class SearchHitOut(BaseModel):
    chunk_id: uuid.UUID
    score: float = Field(
        description="dense: cosine similarity; fulltext: BM25; hybrid: the fused score "
        "(reciprocal rank fusion by default); grouped by document: the document's score"
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
