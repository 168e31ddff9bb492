"""Feedback rows on logged answers, and the rows fine-tuning exports read."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from sqlalchemy import Row, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from ragservice.db.models import Feedback
from ragservice.store.query_log import Citation, RetrievedChunk
from ragservice.types import Scale


@dataclass(frozen=True, slots=True)
class NewFeedback:
    query_id: uuid.UUID
    tenant_id: uuid.UUID
    rating: int | None
    scale: Scale
    comment: str | None
    corrected_answer: str | None
    relevant_chunk_ids: Sequence[uuid.UUID]
    irrelevant_chunk_ids: Sequence[uuid.UUID]
    key_id: uuid.UUID | None = None
    asker: str | None = None


@dataclass(frozen=True, slots=True)
class FeedbackEntry:
    """One feedback row as an export reads it."""

    rating: int | None
    scale: Scale
    corrected_answer: str | None
    relevant: tuple[uuid.UUID, ...]
    irrelevant: tuple[uuid.UUID, ...]
    created_at: datetime


class TimeOf(StrEnum):
    """What an export's `since`/`until` bound: the feedback's time or the answer's."""

    FEEDBACK = "feedback"
    QUERY = "query"


ExportOrder = Literal["time", "question"]


@dataclass(frozen=True, slots=True)
class ExportFilter:
    """Which feedback an export reads: always one tenant's.

    `collection_id` or `collection` (a name) keeps answers to questions asked over that
    collection. `since` (inclusive) and `until` (exclusive) bound the time of the feedback, or
    of the answer with `time_of=query`; naive datetimes are UTC. `min_rating`/`max_rating`
    bound the latest rating of each answer, on its own scale (thumbs -1/+1, stars 1..5);
    with either set, answers without a rating are left out.
    """

    tenant_id: uuid.UUID
    collection_id: uuid.UUID | None = None
    collection: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    min_rating: int | None = None
    max_rating: int | None = None
    time_of: TimeOf = TimeOf.FEEDBACK


@dataclass(frozen=True, slots=True)
class ExportRow:
    """A logged answer with its feedback (oldest first) and the texts of the chunks an export
    may need: the top of `ranked`, the cited ones and the judged ones (empty when not asked)."""

    query_id: uuid.UUID
    question: str
    answer: str | None
    status: str
    messages: list[dict[str, Any]] | None
    ranked: tuple[uuid.UUID, ...]  # retrieved chunk ids, best first
    cited: tuple[uuid.UUID, ...]
    collection_ids: tuple[uuid.UUID, ...]  # sorted
    created_at: datetime
    feedback: tuple[FeedbackEntry, ...]
    chunk_texts: dict[uuid.UUID, str]
    question_key: str  # lower case, white space collapsed, trailing punctuation dropped


def add_feedback(session: Session, feedback: NewFeedback) -> Feedback:
    stmt = (
        insert(Feedback)
        .values(
            query_id=feedback.query_id,
            tenant_id=feedback.tenant_id,
            rating=feedback.rating,
            scale=feedback.scale,
            comment=feedback.comment,
            corrected_answer=feedback.corrected_answer,
            relevant_chunk_ids=list(feedback.relevant_chunk_ids),
            irrelevant_chunk_ids=list(feedback.irrelevant_chunk_ids),
            key_id=feedback.key_id,
            asker=feedback.asker,
        )
        .returning(Feedback)
    )
    return session.scalars(stmt).one()


# Each answer with feedback, its feedback rows aggregated oldest first, and its latest rating
# (the rating filters apply to that one). Only fixed fragments are substituted into it.
_EXPORT_ROWS = """
SELECT q.id, q.question, q.answer, q.status, q.messages, q.retrieved, q.citations,
       ARRAY(SELECT c FROM unnest(q.collection_ids) AS c ORDER BY c) AS scope,
       q.created_at, fb.entries, {texts} AS texts,
       regexp_replace(lower(regexp_replace(btrim(q.question), '[[:space:]]+', ' ', 'g')),
                      '[[:space:][:punct:]]+$', '') AS question_key
FROM query_log q
CROSS JOIN LATERAL (
    SELECT jsonb_agg(jsonb_build_object(
               'rating', f.rating, 'scale', f.scale, 'corrected_answer', f.corrected_answer,
               'relevant', f.relevant_chunk_ids, 'irrelevant', f.irrelevant_chunk_ids,
               'created_at', f.created_at) ORDER BY f.created_at, f.id) AS entries,
           (array_agg(f.rating ORDER BY f.created_at DESC, f.id DESC)
                FILTER (WHERE f.rating IS NOT NULL))[1] AS rating
    FROM feedback f
    WHERE f.query_id = q.id AND f.tenant_id = q.tenant_id AND {feedback_window}
) fb
WHERE q.tenant_id = :tenant
  AND q.redacted_at IS NULL
  AND q.id IN (SELECT f.query_id FROM feedback f WHERE f.tenant_id = :tenant AND {feedback_window})
  AND fb.entries IS NOT NULL
  AND (CAST(:collection AS uuid) IS NULL OR CAST(:collection AS uuid) = ANY(q.collection_ids))
  AND {query_window}
  AND (CAST(:min_rating AS int) IS NULL OR fb.rating >= CAST(:min_rating AS int))
  AND (CAST(:max_rating AS int) IS NULL OR fb.rating <= CAST(:max_rating AS int))
ORDER BY {order}
"""

# The chunks' ids as one array (not a UNION of subqueries: Citus pushes no UNION of table
# functions down to the workers).
_EXPORT_TEXTS = """(
    SELECT jsonb_object_agg(CAST(c.id AS text), c.text) FROM chunks c
    WHERE c.tenant_id = q.tenant_id AND c.id = ANY(
        ARRAY(SELECT CAST(r.item ->> 'chunk_id' AS uuid)
              FROM jsonb_array_elements(q.retrieved) WITH ORDINALITY AS r(item, n)
              WHERE r.n <= :depth)
        || ARRAY(SELECT CAST(jsonb_array_elements_text(s.item -> 'chunk_ids') AS uuid)
                 FROM jsonb_array_elements(q.citations) AS s(item))
        || ARRAY(SELECT unnest(f.relevant_chunk_ids || f.irrelevant_chunk_ids) FROM feedback f
                 WHERE f.query_id = q.id AND f.tenant_id = q.tenant_id)))"""

_WINDOW = (
    "(CAST(:since AS timestamptz) IS NULL OR {column} >= CAST(:since AS timestamptz)) "
    "AND (CAST(:until AS timestamptz) IS NULL OR {column} < CAST(:until AS timestamptz))"
)

_EXPORT_ORDER = {
    "time": "q.created_at, q.id",
    # Answers to the same question over the same collections come out next to each other.
    "question": "question_key, scope, q.created_at, q.id",
}


def export_rows(
    session: Session,
    flt: ExportFilter,
    *,
    text_depth: int | None = None,
    order: ExportOrder = "time",
    batch_size: int = 500,
) -> Iterator[ExportRow]:
    """The answers with feedback that `flt` selects (its collection already resolved to an id,
    see `feedback.exports.resolve_filter`), streamed from a server-side cursor in batches of
    `batch_size`; iterate while the session is open.

    With `time_of=query` every feedback row of a chosen answer counts. With `text_depth`, chunk
    texts come along for the top `text_depth` retrieved, the cited and the judged chunks.
    `order`: "time" (answer time) or "question" (grouped by question and collections).
    Answers redacted because a source document was deleted are left out.
    """
    by_query_time = flt.time_of == TimeOf.QUERY
    feedback_window = "TRUE" if by_query_time else _WINDOW.format(column="f.created_at")
    statement = _EXPORT_ROWS.format(
        texts="NULL::jsonb" if text_depth is None else _EXPORT_TEXTS,
        feedback_window=feedback_window,
        query_window=_WINDOW.format(column="q.created_at") if by_query_time else "TRUE",
        order=_EXPORT_ORDER[order],
    )
    params = {
        "tenant": flt.tenant_id,
        "collection": flt.collection_id,
        "since": flt.since,
        "until": flt.until,
        "min_rating": flt.min_rating,
        "max_rating": flt.max_rating,
        "depth": text_depth or 0,
    }
    result = session.execute(text(statement).execution_options(yield_per=batch_size), params)
    for row in result:
        yield _export_row(row)


def _export_row(row: Row[Any]) -> ExportRow:
    values = row._mapping
    citations = [Citation.from_json(item) for item in values["citations"] or ()]
    return ExportRow(
        query_id=values["id"],
        question=values["question"],
        answer=values["answer"],
        status=values["status"],
        messages=values["messages"],
        ranked=tuple(RetrievedChunk.from_json(item).chunk_id for item in values["retrieved"] or ()),
        cited=tuple(chunk_id for citation in citations for chunk_id in citation.chunk_ids),
        collection_ids=tuple(values["scope"]),
        created_at=values["created_at"],
        feedback=tuple(_feedback_entry(entry) for entry in values["entries"]),
        chunk_texts={uuid.UUID(k): v for k, v in (values["texts"] or {}).items()},
        question_key=values["question_key"],
    )


def _feedback_entry(entry: dict[str, Any]) -> FeedbackEntry:
    return FeedbackEntry(
        rating=entry["rating"],
        scale=entry["scale"],
        corrected_answer=entry["corrected_answer"],
        relevant=tuple(uuid.UUID(i) for i in entry["relevant"] or ()),
        irrelevant=tuple(uuid.UUID(i) for i in entry["irrelevant"] or ()),
        created_at=datetime.fromisoformat(entry["created_at"]),
    )
