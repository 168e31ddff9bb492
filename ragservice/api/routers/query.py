"""`POST /v1/query`: an answer with citations, whole or streamed as server-sent events."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from ragservice.answering.answer import Answer
from ragservice.api.charges import charge
from ragservice.api.deps import AnswersDep, Reader, replica_reads
from ragservice.api.error_handlers import stopped_stream_error, stream_error
from ragservice.api.schemas.answers import QueryRequest
from ragservice.api.schemas.common import error_responses
from ragservice.api.stopping import first_unless_stopping, next_unless_stopping, stopping_of
from ragservice.limits.rate_limits import ANSWER_COST
from ragservice.services.views import answer_out

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
    body: QueryRequest,
    principal: Reader,
    answers: AnswersDep,
    request: Request,
) -> Any:
    """Answer a question from the collections, citing sources as [1], [2]…

    With `stream: true` the reply is `text/event-stream`: `token` events with pieces of the
    answer as they are generated, then `citations` (citations and sources), then `done` (the
    rest of the QueryResponse: query_id, the whole answer, model, status, timings). A stream
    that fails, or is cut short because the server is stopping, ends with an `error` event
    instead (`{"error", "detail", "request_id"}`; `ServiceStopping` for the latter).
    """
    ask = body.ask_query()
    answers.check(ask, field="question")
    charge(request, principal.rate_key, ANSWER_COST, what="an answer")
    if not body.stream:
        return answer_out(await answers.answer(principal.tenant_id, ask))
    events = await answers.stream(principal.tenant_id, ask)
    # Wait for the first piece before answering 200, so that a failure to retrieve or to reach
    # the inference layer still gets its proper status code instead of a broken stream.
    first = await first_unless_stopping(events, stopping_of(request))
    return StreamingResponse(_sse(request, first, events), media_type="text/event-stream")


async def _sse(
    request: Request, first: str | Answer, events: AsyncGenerator[str | Answer, None]
) -> AsyncIterator[str]:
    """`token` events, then `citations` (with the sources), then `done` with the rest."""
    stopping = stopping_of(request)
    async with aclosing(events):
        item: str | Answer | None = first
        while not isinstance(item, Answer):
            yield _event("token", {"text": item})
            try:
                item = await next_unless_stopping(events, stopping)
            except Exception as exc:  # mid-stream: the status line is gone, tell it in the stream
                yield _event("error", stream_error(request, exc))
                return
            if item is None:  # the server is stopping
                yield _event("error", stopped_stream_error(request))
                return
        whole = answer_out(item).model_dump(mode="json")
        yield _event("citations", {k: whole.pop(k) for k in ("citations", "sources")})
        yield _event("done", whole)


def _event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
