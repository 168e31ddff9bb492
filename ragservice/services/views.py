"""The documents the service answers with — a search's hits, an answer with its citations and
sources — as the REST API sends them and as `ragservice search` / `ask --json` print them: one
definition for every interface (the API's schemas import them from here)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from ragservice.answering.answer import Answer
from ragservice.answering.context import Source
from ragservice.answering.question import AnswerStatus
from ragservice.embedding.registry import ServingModel
from ragservice.retrieval.search import Mode, SearchHit
from ragservice.services.search import Found
from ragservice.types import PageSpan

Pages = Annotated[
    list[int] | None,
    Field(
        description="the pages (1-based) of a paged document the text lies on: a PDF's pages, "
        "a deck's slides, a workbook's sheets; every one from the first to the last, e.g. "
        "[12, 13]; null for a document without pages"
    ),
]


SourcePages = Annotated[
    list[int] | None,
    Field(
        description="the pages (1-based; a deck's slides, a workbook's sheets) where the "
        "source's hits lie: those of its best chunk and of any other about as strong, every "
        "one from the first to the last, e.g. [3]; not those of the context around them "
        "that `text` also holds; null for a document without pages"
    ),
]


def pages_out(span: PageSpan | None) -> list[int] | None:
    return None if span is None else span.numbers


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
    pages: SourcePages = None
    cited_as: str = Field(
        description="the source named for a reader: `Title (report.pdf, p. 12)`, or "
        "`report.pdf, pp. 12\u201313` without a title; `deck.pptx, slide 4`, "
        '`book.xlsx, sheet "Q3", rows 12\u201340`; without pages for a document that has none'
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
    pages: SourcePages = None
    cited_as: str = Field(description="the source named for a reader, as in a citation")


class QueryResponse(BaseModel):
    query_id: uuid.UUID = Field(description="refer to this answer (e.g. in feedback)")
    answer: str
    citations: list[CitationOut] = Field(description="the sources the answer cites")
    sources: list[SourceOut] = Field(description="every source handed to the model, numbered")
    model: str = Field(description="the upstream model, or `extractive`")
    status: AnswerStatus = Field(description="`ok` (generated) or `extractive`")
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


def found_out(found: Found) -> SearchResponse:
    return SearchResponse(
        mode=found.mode,
        results=[hit_out(hit) for hit in found.hits],
        timings_ms=found.timings_ms,
        embedding_model=embedding_model_out(found.model),
    )
