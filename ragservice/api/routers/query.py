"""`POST /v1/query`: an answer with citations, whole or streamed as server-sent events."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from ragservice.answering.answer import Answer
from ragservice.api.charges import charge
from ragservice.api.deps import AnswersDep, Reader, replica_reads
from ragservice.api.schemas.answers import QueryRequest
from ragservice.api.schemas.common import error_responses
from ragservice.api.sse import frame, stream_answer
from ragservice.api.stopping import first_unless_stopping, stopping_of
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
    return StreamingResponse(
        stream_answer(request, first, events, _QueryEvents()), media_type="text/event-stream"
    )


class _QueryEvents:
    """`token` events, then `citations` (with the sources), then `done` with the rest."""

    def opening(self) -> Iterable[str]:
        return ()

    def piece(self, text: str) -> str:
        return frame({"text": text}, "token")

    def failed(self, error: dict[str, str]) -> Iterable[str]:
        return (frame(error, "error"),)

    def stopped(self, error: dict[str, str]) -> Iterable[str]:
        return (frame(error, "error"),)

    def finished(self, answer: Answer) -> Iterable[str]:
        whole = answer_out(answer).model_dump(mode="json")
        citations = {k: whole.pop(k) for k in ("citations", "sources")}
        return (frame(citations, "citations"), frame(whole, "done"))
