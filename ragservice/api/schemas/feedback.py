"""Feedback on an answer: what a caller sends, and the stored feedback as it is read back."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from ragservice.api.schemas.common import Storable
from ragservice.db.models import Feedback
from ragservice.feedback.collect import MAX_FEEDBACK_CHARS, MAX_JUDGED_CHUNKS
from ragservice.types import Scale

FeedbackText = Annotated[str, StringConstraints(max_length=MAX_FEEDBACK_CHARS), Storable]


class FeedbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rating: int | None = Field(
        default=None, description="thumbs: +1 or -1; stars: 1 to 5; null: no rating"
    )
    scale: Scale = "thumbs"
    comment: FeedbackText | None = None
    corrected_answer: FeedbackText | None = Field(
        default=None, description="the answer it should have been"
    )
    relevant_chunk_ids: list[uuid.UUID] = Field(
        default_factory=list,
        max_length=MAX_JUDGED_CHUNKS,
        description="chunks that helped: retrieved for the answer or in its collections",
    )
    irrelevant_chunk_ids: list[uuid.UUID] = Field(
        default_factory=list, max_length=MAX_JUDGED_CHUNKS, description="chunks that did not"
    )


class FeedbackRequest(FeedbackBody):
    query_id: uuid.UUID = Field(description="the answer's `query_id`")


class FeedbackOut(BaseModel):
    id: uuid.UUID
    query_id: uuid.UUID
    rating: int | None
    scale: Scale
    comment: str | None
    corrected_answer: str | None
    relevant_chunk_ids: list[uuid.UUID]
    irrelevant_chunk_ids: list[uuid.UUID]
    created_at: datetime


def feedback_out(feedback: Feedback) -> FeedbackOut:
    return FeedbackOut(
        id=feedback.id,
        query_id=feedback.query_id,
        rating=feedback.rating,
        scale="stars" if feedback.scale == "stars" else "thumbs",
        comment=feedback.comment,
        corrected_answer=feedback.corrected_answer,
        relevant_chunk_ids=list(feedback.relevant_chunk_ids),
        irrelevant_chunk_ids=list(feedback.irrelevant_chunk_ids),
        created_at=feedback.created_at,
    )
