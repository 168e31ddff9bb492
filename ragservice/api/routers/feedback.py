"""Feedback on answers, and its export as fine-tuning data.

- `POST /v1/feedback`: rate, comment on or correct an answer (`query_id` from `/v1/query`),
  and mark its chunks relevant or irrelevant.
- `POST /v1/chat/completions/{query_id}/feedback`: the same for a chat completion (its
  `query_id` extension field).
- `GET /v1/feedback/export`: the caller's tenant's feedback as NDJSON fine-tuning data.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, status
from fastapi.responses import StreamingResponse

from ragservice.api.deps import Admin, DatabaseDep, Principal, Reader
from ragservice.api.schemas.common import error_responses
from ragservice.api.schemas.feedback import (
    FeedbackBody,
    FeedbackOut,
    FeedbackRequest,
    feedback_out,
)
from ragservice.db import Database
from ragservice.feedback import exports
from ragservice.feedback.collect import FeedbackInput
from ragservice.feedback.exports import (
    HIGHEST_RATING,
    LOWEST_RATING,
    ExportFilter,
    ExportFormat,
    TimeOf,
)
from ragservice.services.feedback import export_feedback as feedback_export
from ragservice.services.feedback import give_feedback

router = APIRouter(prefix="/v1", tags=["feedback"], responses=error_responses())

NDJSON = "application/x-ndjson"


@router.post("/feedback", status_code=status.HTTP_201_CREATED)
def post_feedback(body: FeedbackRequest, principal: Reader, db: DatabaseDep) -> FeedbackOut:
    """Feedback on an answer: a rating (thumbs +1/-1 or 1-5 stars), a comment, a corrected
    answer, chunks that were relevant or not. 404 for an answer that is not yours."""
    return _submit(db, principal, body.query_id, body)


@router.post("/chat/completions/{query_id}/feedback", status_code=status.HTTP_201_CREATED)
def post_chat_feedback(
    query_id: uuid.UUID, body: FeedbackBody, principal: Reader, db: DatabaseDep
) -> FeedbackOut:
    """Feedback on a chat completion, by the `query_id` it returned."""
    return _submit(db, principal, query_id, body)


@router.get(
    "/feedback/export",
    response_class=StreamingResponse,
    responses={200: {"content": {NDJSON: {}}, "description": "one JSON record per line"}},
)
def export_feedback(
    principal: Admin,
    db: DatabaseDep,
    fmt: Annotated[ExportFormat, Query(alias="format")],
    collection: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    time_of: TimeOf = TimeOf.FEEDBACK,
    min_rating: Annotated[int | None, Query(ge=LOWEST_RATING, le=HIGHEST_RATING)] = None,
    max_rating: Annotated[int | None, Query(ge=LOWEST_RATING, le=HIGHEST_RATING)] = None,
    negatives_per_positive: Annotated[
        int, Query(ge=1, le=exports.MAX_NEGATIVES_PER_POSITIVE)
    ] = exports.DEFAULT_NEGATIVES_PER_POSITIVE,
) -> StreamingResponse:
    """Your tenant's feedback as fine-tuning data (`openai-sft`, `openai-dpo`, `trl-dpo`,
    `triplets`), streamed as NDJSON. `since` (inclusive) and `until` (exclusive) bound the
    feedback's time, or the answer's with `time_of=query`."""
    flt = ExportFilter(
        tenant_id=principal.tenant_id,
        collection=collection,
        since=since,
        until=until,
        time_of=time_of,
        min_rating=min_rating,
        max_rating=max_rating,
    )
    # Resolved before the first byte, so that a bad filter still gets its status code.
    body = feedback_export(db, principal, fmt, flt, negatives_per_positive=negatives_per_positive)
    disposition = f'attachment; filename="feedback-{fmt.value}.jsonl"'
    return StreamingResponse(body, media_type=NDJSON, headers={"content-disposition": disposition})


def _submit(
    db: Database, principal: Principal, query_id: uuid.UUID, body: FeedbackBody
) -> FeedbackOut:
    feedback = FeedbackInput(
        rating=body.rating,
        scale=body.scale,
        comment=body.comment,
        corrected_answer=body.corrected_answer,
        relevant_chunk_ids=body.relevant_chunk_ids,
        irrelevant_chunk_ids=body.irrelevant_chunk_ids,
    )
    return feedback_out(give_feedback(db, principal, query_id, feedback))
