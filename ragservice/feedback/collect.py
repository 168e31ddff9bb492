"""Feedback on logged answers: what a caller may say about one, and how it is stored.

A feedback row rates an answer (thumbs +1/-1, or 1..5 stars), comments on it, corrects it,
and marks chunks relevant or irrelevant. Every chunk it judges must have been retrieved for
that answer or be a chunk of one of the collections the question was asked over. Several rows
may refer to the same answer; exports read the latest of each.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sqlalchemy.orm import Session

from ragservice import store
from ragservice.db import Database
from ragservice.db.models import Feedback
from ragservice.db.scope import current_asker
from ragservice.errors import InvalidInputError, NotFoundError
from ragservice.types import Scale

MAX_FEEDBACK_CHARS = 20_000
"""The longest comment or corrected answer, in characters."""

MAX_JUDGED_CHUNKS = 200
"""The most chunk ids one list (relevant or irrelevant) may hold."""

QUERY_WAIT_SECONDS = 1.0
"""How long feedback waits for its answer's log row, which is written just after the answer
is sent: a client quick enough can refer to an answer before its row is committed."""

_RATINGS: dict[str, tuple[int, ...]] = {"thumbs": (-1, 1), "stars": (1, 2, 3, 4, 5)}


@dataclass(frozen=True, slots=True)
class FeedbackInput:
    rating: int | None = None
    scale: Scale = "thumbs"
    comment: str | None = None
    corrected_answer: str | None = None
    relevant_chunk_ids: Sequence[uuid.UUID] = ()
    irrelevant_chunk_ids: Sequence[uuid.UUID] = ()


def is_good(rating: int | None, scale: Scale) -> bool:
    """A thumbs up, or four stars and more."""
    if rating is None:
        return False
    return rating >= 4 if scale == "stars" else rating > 0


def is_bad(rating: int | None, scale: Scale) -> bool:
    """A thumbs down, or two stars and fewer."""
    if rating is None:
        return False
    return rating <= 2 if scale == "stars" else rating < 0


def checked(feedback: FeedbackInput) -> FeedbackInput:
    """The feedback with blank texts dropped and chunk ids de-duplicated (in order), or an
    InvalidInputError that says what is wrong with it."""
    cleaned = replace(
        feedback,
        comment=_text(feedback.comment, "comment"),
        corrected_answer=_text(feedback.corrected_answer, "corrected_answer"),
        relevant_chunk_ids=_ids(feedback.relevant_chunk_ids, "relevant_chunk_ids"),
        irrelevant_chunk_ids=_ids(feedback.irrelevant_chunk_ids, "irrelevant_chunk_ids"),
    )
    allowed = _RATINGS[cleaned.scale]
    if cleaned.rating is not None and cleaned.rating not in allowed:
        shown = "+1 or -1" if cleaned.scale == "thumbs" else "1 to 5"
        raise InvalidInputError(
            f"rating: {cleaned.rating} is not a {cleaned.scale} rating ({shown})"
        )
    both = set(cleaned.relevant_chunk_ids) & set(cleaned.irrelevant_chunk_ids)
    if both:
        raise InvalidInputError(
            f"chunk {min(both, key=str)} is marked both relevant and irrelevant"
        )
    if _empty(cleaned):
        raise InvalidInputError(
            "give at least one of rating, comment, corrected_answer, relevant_chunk_ids "
            "or irrelevant_chunk_ids"
        )
    return cleaned


def _text(value: str | None, field: str) -> str | None:
    if value is None or not value.strip():
        return None
    if len(value) > MAX_FEEDBACK_CHARS:
        raise InvalidInputError(
            f"{field}: {len(value)} characters; the limit is {MAX_FEEDBACK_CHARS}"
        )
    return value


def _ids(ids: Sequence[uuid.UUID], field: str) -> tuple[uuid.UUID, ...]:
    unique = tuple(dict.fromkeys(ids))
    if len(unique) > MAX_JUDGED_CHUNKS:
        raise InvalidInputError(f"{field}: at most {MAX_JUDGED_CHUNKS} chunk ids")
    return unique


def _empty(feedback: FeedbackInput) -> bool:
    return (
        feedback.rating is None
        and feedback.comment is None
        and feedback.corrected_answer is None
        and not feedback.relevant_chunk_ids
        and not feedback.irrelevant_chunk_ids
    )


def submit_feedback(
    db: Database,
    *,
    tenant_id: uuid.UUID,
    query_id: uuid.UUID,
    feedback: FeedbackInput,
    key_id: uuid.UUID | None = None,
    wait_seconds: float = QUERY_WAIT_SECONDS,
) -> Feedback:
    """Check and store feedback on the tenant's answer `query_id`.

    NotFoundError for an answer that is not the tenant's (another tenant's answers get the same
    message as missing ones); InvalidInputError for anything wrong with the feedback itself.
    """
    feedback = checked(feedback)
    query = _await_query(db, tenant_id, query_id, wait_seconds)
    with db.write() as session:
        _check_chunks(session, query, feedback)
        return store.feedback.add_feedback(
            session,
            store.feedback.NewFeedback(
                query_id=query.id,
                tenant_id=tenant_id,
                rating=feedback.rating,
                scale=feedback.scale,
                comment=feedback.comment,
                corrected_answer=feedback.corrected_answer,
                relevant_chunk_ids=feedback.relevant_chunk_ids,
                irrelevant_chunk_ids=feedback.irrelevant_chunk_ids,
                key_id=key_id,
                asker=current_asker(),
            ),
        )


def _await_query(
    db: Database, tenant_id: uuid.UUID, query_id: uuid.UUID, wait_seconds: float
) -> store.query_log.LoggedQuery:
    # Requests that write read on the primary, where the log row lands first.
    deadline = time.monotonic() + wait_seconds
    while True:
        with db.read() as session:
            query = store.query_log.get_logged_query(session, tenant_id, query_id)
        if query is not None:
            return query
        if time.monotonic() >= deadline:
            raise NotFoundError(f"query {query_id} not found")
        time.sleep(0.05)


def _check_chunks(
    session: Session, query: store.query_log.LoggedQuery, feedback: FeedbackInput
) -> None:
    judged = [*feedback.relevant_chunk_ids, *feedback.irrelevant_chunk_ids]
    outside = store.query_log.chunks_outside_query(session, query, judged)
    if outside:
        raise InvalidInputError(
            f"chunk {outside[0]} was not retrieved for query {query.id} and is not in "
            "one of its collections"
        )
