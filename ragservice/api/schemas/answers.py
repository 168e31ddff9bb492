"""Answers (`POST /v1/query`): the question, and the answer with its citations and sources.

A streamed answer sends the same response in pieces: `token` events (`{"text"}`), then
`citations` (its `citations` and `sources`), then `done` (the rest); a failure after the first
token ends the stream with an `error` event whose data is the error body (`ErrorOut`).
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ragservice.answering.answer import Answer, Status
from ragservice.answering.context import Source
from ragservice.api.schemas.common import CollectionNames, JsonObject, Pages, Text, pages_out
from ragservice.retrieval.search import Mode


class QueryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: Text = Field(min_length=1)
    collections: CollectionNames | None = None
    mode: Mode = Mode.HYBRID
    k: int = Field(default=8, ge=1, description="chunks retrieved (after reranking) for context")
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


class CacheOut(BaseModel):
    hit: bool
    kind: Literal["exact", "semantic"] | None = None
    similarity: float | None = None
    entry_id: uuid.UUID | None = None
    refused: str | None = Field(
        default=None, description="why the meaning guard turned a near match away"
    )


class DocumentRefLite(BaseModel):
    id: uuid.UUID
    external_id: str
    title: str | None


class CitationOut(BaseModel):
    number: int
    document: DocumentRefLite
    chunk_ids: list[uuid.UUID]
    start_char: int
    end_char: int
    pages: Pages = None
    cited_as: str = Field(
        description="the source named for a reader: `Title (report.pdf, p. 12)`, or "
        "`report.pdf, pp. 12\u201313` without a title; without pages for a document that has none"
    )


class SourceOut(BaseModel):
    number: int
    text: str
    score: float
    flagged: bool = Field(
        default=False,
        description="a chunk in it reads like instructions to a model (flagged at ingest)",
    )
    document: DocumentRefLite
    chunk_ids: list[uuid.UUID]
    start_char: int
    end_char: int
    pages: Pages = None
    cited_as: str = Field(description="the source named for a reader, as in a citation")


class QueryResponse(BaseModel):
    query_id: uuid.UUID = Field(description="refer to this answer (e.g. in feedback)")
    answer: str
    citations: list[CitationOut] = Field(description="the sources the answer cites")
    sources: list[SourceOut] = Field(description="every source handed to the model, numbered")
    model: str = Field(description="the upstream model, or `extractive`")
    status: Status = Field(description="`ok` (generated) or `extractive`")
    timings_ms: dict[str, float]
    cache: CacheOut | None = Field(description="what the prompt cache did; null when not used")


def answer_out(answer: Answer) -> QueryResponse:
    return QueryResponse(
        query_id=answer.query_id,
        answer=answer.text,
        citations=[_citation_out(c) for c in answer.citations],
        sources=[_source_out(s) for s in answer.sources],
        model=answer.model,
        status=answer.status,
        timings_ms=answer.timings_ms,
        cache=None if answer.cache is None else CacheOut(**answer.cache.to_dict()),
    )


def _citation_out(citation: Source) -> CitationOut:
    return CitationOut(**_passage(citation))


def _source_out(source: Source) -> SourceOut:
    return SourceOut(
        **_passage(source), text=source.text, score=source.score, flagged=source.flagged
    )


def _passage(source: Source) -> dict[str, Any]:
    """What a citation and a source say alike: the number, the document and the span."""
    return {
        "number": source.number,
        "document": DocumentRefLite(
            id=source.document_id, external_id=source.external_id, title=source.title
        ),
        "chunk_ids": list(source.chunk_ids),
        "start_char": source.start_char,
        "end_char": source.end_char,
        "pages": pages_out(source.pages),
        "cited_as": source.cited_as,
    }
