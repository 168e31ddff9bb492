"""`POST /v1/query`: an answer with citations, whole or streamed as server-sent events."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse

from ragservice.answering.answer import Answer, Question
from ragservice.answering.context import Source
from ragservice.api.deps import PipelineDep, Reader, RuntimeDep, replica_reads
from ragservice.api.routers.search import check_query, collection_ids
from ragservice.api.schemas import (
    CacheOut,
    CitationOut,
    DocumentRefLite,
    QueryRequest,
    QueryResponse,
    SourceOut,
    error_responses,
)
from ragservice.errors import RagServiceError
from ragservice.retrieval.filters import parse_and_compile
from ragservice.retrieval.search import SearchOptions

router = APIRouter(
    prefix="/v1",
    tags=["query"],
    dependencies=[Depends(replica_reads)],
    responses=error_responses(502, 504),
)


@router.post(
    "/query",
    responses={200: {"content": {"text/event-stream": {}}, "description": "with `stream`"}},
)
async def query(
    body: QueryRequest, principal: Reader, runtime: RuntimeDep, pipeline: PipelineDep
) -> Any:
    """Answer a question from the collections, citing sources as [1], [2]…

    With `stream: true` the reply is `text/event-stream`: `token` events with pieces of the
    answer as they are generated, then `citations` (citations and sources), then `done` (the
    rest of the QueryResponse: query_id, the whole answer, model, status, timings).
    """
    check_query(body.question, body.k, runtime.settings, field="question")
    question = Question(
        text=body.question,
        tenant_id=principal.tenant_id,
        collection_ids=await anyio.to_thread.run_sync(
            collection_ids, runtime, principal.tenant_id, body.collections
        ),
        options=SearchOptions.from_settings(
            runtime.settings, mode=body.mode, k=body.k, filters=parse_and_compile(body.filters)
        ),
        rerank=body.rerank,
        fallback_extractive=body.on_upstream_error == "extractive",
        use_cache=body.cache,
        refresh_cache=body.cache_refresh,
        filters_key=json.dumps(body.filters, sort_keys=True) if body.filters else "",
    )
    if not body.stream:
        return answer_out(await pipeline.answer(question))
    events = pipeline.stream(question)
    # Wait for the first piece before answering 200, so that a failure to retrieve or to reach
    # the inference layer still gets its proper status code instead of a broken stream.
    first = await anext(events)
    return StreamingResponse(_sse(first, events), media_type="text/event-stream")


async def _sse(
    first: str | Answer, events: AsyncGenerator[str | Answer, None]
) -> AsyncIterator[str]:
    """`token` events, then `citations` (with the sources), then `done` with the rest."""
    async with aclosing(events):
        item: str | Answer = first
        while not isinstance(item, Answer):
            yield _event("token", {"text": item})
            try:
                item = await anext(events)
            except Exception as exc:  # mid-stream: the status line is gone, tell it in the stream
                yield _event("error", {"error": type(exc).__name__, "detail": _safe(exc)})
                return
        whole = answer_out(item).model_dump(mode="json")
        yield _event("citations", {k: whole.pop(k) for k in ("citations", "sources")})
        yield _event("done", whole)


def _event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _safe(exc: Exception) -> str:
    return str(exc) if isinstance(exc, RagServiceError) else "internal error"


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
    return CitationOut(
        number=citation.number,
        document=DocumentRefLite(
            id=citation.document_id, external_id=citation.external_id, title=citation.title
        ),
        chunk_ids=list(citation.chunk_ids),
        start_char=citation.start_char,
        end_char=citation.end_char,
    )


def _source_out(source: Source) -> SourceOut:
    return SourceOut(
        number=source.number,
        text=source.text,
        score=source.score,
        document=DocumentRefLite(
            id=source.document_id, external_id=source.external_id, title=source.title
        ),
        chunk_ids=list(source.chunk_ids),
        start_char=source.start_char,
        end_char=source.end_char,
    )
