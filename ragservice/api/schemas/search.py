"""Search: the request; the response is the service's (`services.views.SearchResponse`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ragservice.api.schemas.common import CollectionNames, Finite, JsonObject, Text
from ragservice.limits.results import SEARCH_K
from ragservice.retrieval.fusion import Fusion
from ragservice.retrieval.options import bounds_of
from ragservice.retrieval.search import Mode
from ragservice.services.search import SearchQuery
from ragservice.services.views import SearchResponse as SearchResponse


def _bounded(option: str) -> Any:
    """An optional override of a search option, within its setting's bounds (`bounds_of`)."""
    bounds = bounds_of(option)
    return Field(default=None, ge=bounds.ge, le=bounds.le)


class Ranking(BaseModel):
    """Per-request ranking settings over the server's (`RAGSERVICE_SEARCH_...`): they change
    only how the caller's own candidates are ordered, within the same bounds as the settings."""

    model_config = ConfigDict(extra="forbid")

    fusion: Fusion | None = Field(default=None, description="hybrid: rrf, minmax, zscore, dbsf")
    rrf_k: int | None = _bounded("rrf_k")
    text_weight: Finite | None = _bounded("text_weight")
    adaptive_weight: bool | None = None
    prf: Literal["off", "rm3"] | None = None
    prf_docs: int | None = _bounded("prf_docs")
    prf_terms: int | None = _bounded("prf_terms")
    prf_query_weight: Finite | None = _bounded("prf_query_weight")
    document_share: Finite | None = _bounded("document_share")
    bm25_k1: Finite | None = _bounded("bm25_k1")
    bm25_b: Finite | None = _bounded("bm25_b")

    def overrides(self) -> dict[str, Any]:
        """The options this request sets, by `SearchOptions` field name."""
        given = self.model_dump(exclude_none=True)
        if "prf" in given:
            given["prf"] = given["prf"] == "rm3"
        return given


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: Text = Field(min_length=1)
    collections: CollectionNames | None = None
    mode: Mode = Mode.HYBRID
    k: int = Field(default=SEARCH_K, ge=1)
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

    def search_query(self) -> SearchQuery:
        return SearchQuery(
            text=self.query,
            collections=self.collections,
            mode=self.mode,
            k=self.k,
            filters=self.filters,
            group_documents=self.group_by == "document",
            overrides={} if self.ranking is None else self.ranking.overrides(),
        )
