"""Answers (`POST /v1/query`): the question, and the answer with its citations and sources.

A streamed answer sends the same response in pieces: `token` events (`{"text"}`), then
`citations` (its `citations` and `sources`), then `done` (the rest); a failure after the first
token ends the stream with an `error` event whose data is the error body (`ErrorOut`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ragservice.api.schemas.common import CollectionNames, JsonObject, Text
from ragservice.limits.results import ANSWER_K
from ragservice.retrieval.search import Mode
from ragservice.services.answers import AskQuery
from ragservice.services.search import SearchQuery
from ragservice.services.views import QueryResponse as QueryResponse


class QueryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: Text = Field(min_length=1)
    collections: CollectionNames | None = None
    mode: Mode = Mode.HYBRID
    k: int = Field(
        default=ANSWER_K, ge=1, description="chunks retrieved (after reranking) for context"
    )
    filters: JsonObject | None = None
    rerank: bool | None = Field(
        default=None,
        description="rerank with the configured cross-encoder; unset: when there is one",
    )
    stream: bool = Field(default=False, description="server-sent events: tokens, then the answer")
    on_upstream_error: Literal["error", "extractive"] = Field(
        default="error",
        description="`extractive`: answer with the top passages when the inference layer fails",
    )
    cache: bool = Field(default=True, description="false: neither read nor write the cache")
    cache_refresh: bool = Field(
        default=False, description="answer afresh and replace the cached answer"
    )

    def ask_query(self) -> AskQuery:
        return AskQuery(
            search=SearchQuery(
                text=self.question,
                collections=self.collections,
                mode=self.mode,
                k=self.k,
                filters=self.filters,
            ),
            rerank=self.rerank,
            fallback_extractive=self.on_upstream_error == "extractive",
            use_cache=self.cache,
            refresh_cache=self.cache_refresh,
        )
