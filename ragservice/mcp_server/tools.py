"""What each MCP tool does, over a `RagserviceClient`: the calls and the shapes an agent reads.

No MCP here: `server.py` registers these as tools. Each result is a pydantic model, so the
tool's output schema tells the agent what comes back."""

from __future__ import annotations

from pydantic import BaseModel, Field

from ragservice.client import (
    Chunk,
    Citation,
    Collection,
    DocumentDetail,
    Mode,
    RagserviceClient,
    SearchHit,
)


class Hit(BaseModel):
    """One passage found, best first."""

    text: str
    score: float = Field(description="dense: cosine; fulltext: BM25; hybrid: rank fusion")
    title: str | None = Field(description="the document's title")
    document_id: str = Field(description="the document's id, for get_document")
    collection: str
    pages: list[int] | None = Field(default=None, description="pages of a PDF the text lies on")
    chunk_id: str


class SearchResult(BaseModel):
    hits: list[Hit]


class CitedSource(BaseModel):
    """A source the answer cites as [number]."""

    number: int
    title: str | None
    cited_as: str | None = Field(description="the source named for a reader, pages included")
    document_id: str = Field(description="the document's id, for get_document")
    pages: list[int] | None = None


class AnswerResult(BaseModel):
    answer: str = Field(description="the answer, citing its sources as [1], [2]…")
    citations: list[CitedSource]


class CollectionInfo(BaseModel):
    name: str
    description: str | None
    document_count: int


class CollectionList(BaseModel):
    collections: list[CollectionInfo]


class DocumentText(BaseModel):
    document_id: str
    collection: str
    title: str | None
    source: str | None = Field(description="the file it was read from, if any")
    metadata: dict[str, object]
    text: str = Field(description="the document's text, as its chunks hold it")


def search(
    client: RagserviceClient, query: str, collections: list[str] | None, k: int, mode: Mode
) -> SearchResult:
    found = client.search(query, collections=collections, k=k, mode=mode)
    return SearchResult(hits=[_hit(hit) for hit in found["results"]])


def ask(client: RagserviceClient, question: str, collections: list[str] | None) -> AnswerResult:
    answered = client.answer(question, collections=collections)
    return AnswerResult(
        answer=answered["answer"],
        citations=[_cited(citation) for citation in answered["citations"]],
    )


def list_collections(client: RagserviceClient) -> CollectionList:
    return CollectionList(collections=[_collection(found) for found in client.collections()])


def get_document(client: RagserviceClient, collection: str, document_id: str) -> DocumentText:
    found = client.document(collection, document_id)
    return _document(found, collection)


def document_text(chunks: list[Chunk]) -> str:
    """The text the chunks cover, in order: each chunk is the slice `start_char:end_char` of
    the document, and chunks may overlap; a gap between two (whitespace the chunker left out)
    reads as a line break."""
    pieces: list[str] = []
    covered = 0
    for chunk in sorted(chunks, key=lambda c: c["start_char"]):
        start, end = chunk["start_char"], chunk["end_char"]
        if end <= covered:
            continue
        if pieces and start > covered:
            pieces.append("\n")
        pieces.append(_own_text(chunk)[max(covered - start, 0) :])
        covered = end
    return "".join(pieces)


def _own_text(chunk: Chunk) -> str:
    """The chunk's slice of its document: without the table header (chunk metadata
    `table_header`) a chunk of a table's later rows repeats before them."""
    header = (chunk.get("metadata") or {}).get("table_header")
    text = chunk["text"]
    if isinstance(header, str) and text.startswith(header + "\n"):
        return text[len(header) + 1 :]
    return text


def _hit(hit: SearchHit) -> Hit:
    return Hit(
        text=hit["text"],
        score=hit["score"],
        title=hit["document"]["title"],
        document_id=hit["document"]["external_id"],
        collection=hit["collection"],
        pages=hit.get("pages"),
        chunk_id=hit["chunk_id"],
    )


def _cited(citation: Citation) -> CitedSource:
    return CitedSource(
        number=citation["number"],
        title=citation["document"]["title"],
        cited_as=citation.get("cited_as"),
        document_id=citation["document"]["external_id"],
        pages=citation.get("pages"),
    )


def _collection(found: Collection) -> CollectionInfo:
    return CollectionInfo(
        name=found["name"],
        description=found["description"],
        document_count=found["document_count"],
    )


def _document(found: DocumentDetail, collection: str) -> DocumentText:
    return DocumentText(
        document_id=found["external_id"],
        collection=collection,
        title=found["title"],
        source=found["source"],
        metadata=found["metadata"],
        text=document_text(found["chunks"] or []),
    )
