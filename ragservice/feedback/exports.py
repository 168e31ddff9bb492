"""Feedback turned into fine-tuning data, one JSON object per line.

- `openai-sft`: `{"messages": [system, ..., user, assistant]}`, the prompt the service sent and
  the answer to teach: the correction, else the answer itself when it was rated well.
- `openai-dpo`: `{"input": {"messages": [...]}, "preferred_output": [assistant],
  "non_preferred_output": [assistant]}` (OpenAI preference fine-tuning).
- `trl-dpo`: `{"prompt": [...], "chosen": [assistant], "rejected": [assistant]}` (TRL's
  conversational preference type).
- `triplets`: `{"anchor": question, "positive": chunk text, "negative": chunk text}` for
  sentence-transformers (e.g. MultipleNegativesRankingLoss).

The functions from a row to records are pure; `records`, `triplets` and `ndjson` read the rows
from the store as a stream, so an export of any size runs in bounded memory.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from itertools import groupby
from typing import Any

from sqlalchemy.orm import Session

from ragservice import store
from ragservice.db import Database
from ragservice.errors import InvalidInputError
from ragservice.feedback.collect import is_bad, is_good
from ragservice.store.feedback import ExportFilter as ExportFilter
from ragservice.store.feedback import ExportOrder, ExportRow, FeedbackEntry
from ragservice.store.feedback import TimeOf as TimeOf
from ragservice.types import Scale

__all__ = [
    "DEFAULT_NEGATIVES_PER_POSITIVE",
    "HARD_NEGATIVE_DEPTH",
    "HIGHEST_RATING",
    "LOWEST_RATING",
    "MAX_NEGATIVES_PER_POSITIVE",
    "ExportFilter",
    "ExportFormat",
    "Pair",
    "TimeOf",
    "Verdict",
    "merge_feedback",
    "ndjson",
    "openai_dpo_record",
    "preference_pairs",
    "records",
    "resolve_filter",
    "row_triplets",
    "sft_record",
    "triplets",
    "trl_dpo_record",
]

DEFAULT_NEGATIVES_PER_POSITIVE = 3
MAX_NEGATIVES_PER_POSITIVE = 100
LOWEST_RATING, HIGHEST_RATING = -1, 5
"""The rating bounds a filter may ask for: thumbs are -1/+1, stars 1..5."""
HARD_NEGATIVE_DEPTH = 10
"""Retrieved chunks ranked this high that the feedback did not mark relevant are negatives."""

# Answers worth teaching: generated ones and extractive ones, never failures.
_TEACHABLE = ("ok", "extractive")

Message = dict[str, str]


class ExportFormat(StrEnum):
    OPENAI_SFT = "openai-sft"
    OPENAI_DPO = "openai-dpo"
    TRL_DPO = "trl-dpo"
    TRIPLETS = "triplets"


def resolve_filter(session: Session, flt: ExportFilter) -> ExportFilter:
    """The filter with its collection name resolved to an id (NotFoundError when the tenant
    has none of that name), times made timezone-aware, and the ranges checked."""
    if flt.collection is not None and flt.collection_id is None:
        found = store.collections.require_collection_id(session, flt.tenant_id, flt.collection)
        flt = replace(flt, collection_id=found)
    flt = replace(flt, since=_aware(flt.since), until=_aware(flt.until))
    if flt.since is not None and flt.until is not None and flt.since >= flt.until:
        raise InvalidInputError("since must be before until")
    low, high = flt.min_rating, flt.max_rating
    if low is not None and high is not None and low > high:
        raise InvalidInputError("min_rating is above max_rating")
    return flt


def _aware(value: datetime | None) -> datetime | None:
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


# -- reading -----------------------------------------------------------------------------------


def records(
    session: Session,
    fmt: ExportFormat,
    flt: ExportFilter,
    *,
    negatives_per_positive: int = DEFAULT_NEGATIVES_PER_POSITIVE,
) -> Iterator[dict[str, Any]]:
    """The export's records in `fmt`, streamed; iterate while the session is open."""
    if fmt is ExportFormat.TRIPLETS:
        yield from triplets(session, flt, negatives_per_positive=negatives_per_positive)
    elif fmt is ExportFormat.OPENAI_SFT:
        for row in _rows(session, flt):
            record = sft_record(row)
            if record is not None:
                yield record
    else:
        shape = openai_dpo_record if fmt is ExportFormat.OPENAI_DPO else trl_dpo_record
        for pair in preference_pairs(_rows(session, flt, order="question")):
            yield shape(pair)


def triplets(
    session: Session,
    flt: ExportFilter,
    *,
    negatives_per_positive: int = DEFAULT_NEGATIVES_PER_POSITIVE,
    depth: int = HARD_NEGATIVE_DEPTH,
) -> Iterator[dict[str, str]]:
    """(anchor, positive, negative) rows for sentence-transformers, streamed: the question,
    a chunk judged relevant, and one of its hardest negatives. Iterate while the session is
    open."""
    for row in _rows(session, flt, text_depth=depth):
        yield from row_triplets(row, negatives_per_positive=negatives_per_positive, depth=depth)


def ndjson(
    db: Database,
    fmt: ExportFormat,
    flt: ExportFilter,
    *,
    negatives_per_positive: int = DEFAULT_NEGATIVES_PER_POSITIVE,
    batch: int = 256,
) -> Iterator[bytes]:
    """The export as NDJSON, in pieces of up to `batch` lines (one record per line), read in
    one read-only session. The REST export and the CLI both write what this yields."""
    with db.read() as session:
        flt = resolve_filter(session, flt)
        lines: list[str] = []
        for record in records(session, fmt, flt, negatives_per_positive=negatives_per_positive):
            lines.append(json.dumps(record, ensure_ascii=False) + "\n")
            if len(lines) >= batch:
                yield "".join(lines).encode()
                lines.clear()
        if lines:
            yield "".join(lines).encode()


def _rows(
    session: Session,
    flt: ExportFilter,
    *,
    order: ExportOrder = "time",
    text_depth: int | None = None,
) -> Iterator[ExportRow]:
    flt = resolve_filter(session, flt)
    return store.feedback.export_rows(session, flt, text_depth=text_depth, order=order)


# -- what the feedback on one answer says --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    """All feedback on one answer, merged: for each field the latest value given wins, and
    for each chunk its latest judgement."""

    rating: int | None = None
    scale: Scale = "thumbs"
    corrected_answer: str | None = None
    relevant: tuple[uuid.UUID, ...] = ()
    irrelevant: tuple[uuid.UUID, ...] = ()

    @property
    def good(self) -> bool:
        return is_good(self.rating, self.scale)

    @property
    def bad(self) -> bool:
        return is_bad(self.rating, self.scale)


def merge_feedback(entries: Iterable[FeedbackEntry]) -> Verdict:
    """Merge feedback rows given oldest first."""
    rating: int | None = None
    scale: Scale = "thumbs"
    corrected: str | None = None
    judged: dict[uuid.UUID, bool] = {}
    for entry in entries:
        if entry.rating is not None:
            rating, scale = entry.rating, entry.scale
        if entry.corrected_answer:
            corrected = entry.corrected_answer
        for chunk_id in entry.relevant:
            judged.pop(chunk_id, None)
            judged[chunk_id] = True
        for chunk_id in entry.irrelevant:
            judged.pop(chunk_id, None)
            judged[chunk_id] = False
    return Verdict(
        rating=rating,
        scale=scale,
        corrected_answer=corrected,
        relevant=tuple(c for c, relevant in judged.items() if relevant),
        irrelevant=tuple(c for c, relevant in judged.items() if not relevant),
    )


# -- chat records --------------------------------------------------------------------------------


def _prompt(row: ExportRow) -> list[Message] | None:
    """The messages the answer was generated from (system, earlier turns, the user turn with
    its numbered sources); None for a cache replay, which has none."""
    if not row.messages:
        return None
    prompt = [{"role": str(m["role"]), "content": str(m["content"])} for m in row.messages]
    return prompt if prompt[-1]["role"] == "user" else None


def _answer(row: ExportRow) -> str | None:
    if row.status not in _TEACHABLE or not row.answer or not row.answer.strip():
        return None
    return row.answer


def _assistant(content: str) -> Message:
    return {"role": "assistant", "content": content}


def sft_record(row: ExportRow) -> dict[str, Any] | None:
    """`{"messages": [...prompt, assistant]}`: the corrected answer if there is one, else the
    logged answer when its latest rating is good; None when there is nothing to teach."""
    prompt = _prompt(row)
    if prompt is None:
        return None
    verdict = merge_feedback(row.feedback)
    target = verdict.corrected_answer or (_answer(row) if verdict.good else None)
    if target is None:
        return None
    return {"messages": [*prompt, _assistant(target)]}


@dataclass(frozen=True, slots=True)
class Pair:
    """A preference: for `prompt`, `chosen` is a better answer than `rejected`."""

    prompt: list[Message]
    chosen: str
    rejected: str


def preference_pairs(rows: Iterable[ExportRow]) -> Iterator[Pair]:
    """Pairs from rows ordered by (question_key, collection ids), as `export_rows` gives them
    with order="question"; only one group of answers is held at a time.

    - a corrected answer: the correction over the logged answer, with that answer's prompt;
    - a badly rated answer (thumbs down, 1-2 stars, not corrected): the latest well-rated
      answer to the same question over the same collections over it, with the prompt of the
      well-rated answer (the one its citations refer to).
    """
    for _key, group in groupby(rows, key=lambda r: (r.question_key, r.collection_ids)):
        yield from _group_pairs(list(group))


def _group_pairs(group: Sequence[ExportRow]) -> Iterator[Pair]:
    verdicts = [merge_feedback(row.feedback) for row in group]
    best: tuple[list[Message], str] | None = None
    for row, verdict in zip(group, verdicts, strict=True):
        prompt, answer = _prompt(row), _answer(row)
        if verdict.corrected_answer is not None:
            if prompt is not None and answer is not None and answer != verdict.corrected_answer:
                yield Pair(prompt, verdict.corrected_answer, answer)
        elif verdict.good and prompt is not None and answer is not None:
            best = (prompt, answer)
    if best is None:
        return
    for row, verdict in zip(group, verdicts, strict=True):
        rejected = row.answer
        if verdict.bad and verdict.corrected_answer is None and rejected and rejected != best[1]:
            yield Pair(best[0], best[1], rejected)


def openai_dpo_record(pair: Pair) -> dict[str, Any]:
    return {
        "input": {"messages": pair.prompt},
        "preferred_output": [_assistant(pair.chosen)],
        "non_preferred_output": [_assistant(pair.rejected)],
    }


def trl_dpo_record(pair: Pair) -> dict[str, Any]:
    return {
        "prompt": pair.prompt,
        "chosen": [_assistant(pair.chosen)],
        "rejected": [_assistant(pair.rejected)],
    }


# -- retrieval triplets --------------------------------------------------------------------------


def row_triplets(
    row: ExportRow,
    *,
    negatives_per_positive: int = DEFAULT_NEGATIVES_PER_POSITIVE,
    depth: int = HARD_NEGATIVE_DEPTH,
) -> Iterator[dict[str, str]]:
    """`{"anchor", "positive", "negative"}` rows for one answer.

    Positives: chunks marked relevant, and the chunks a well-rated answer cited. Negatives:
    chunks marked irrelevant, and, when the feedback marked some chunk relevant, the chunks
    ranked in the top `depth` that it did not. Each positive is paired with up to
    `negatives_per_positive` negatives, the highest ranked first. Texts are the chunks' stored
    texts, which are what ingest embedded; chunks deleted since are skipped.
    """
    verdict = merge_feedback(row.feedback)
    positives = _positives(row, verdict)
    negatives = _negatives(row, verdict, positives, depth)
    texts = row.chunk_texts
    positive_texts = list(dict.fromkeys(texts[c] for c in positives if c in texts))
    negative_texts = [
        text
        for text in dict.fromkeys(texts[c] for c in negatives if c in texts)
        if text not in positive_texts
    ][:negatives_per_positive]
    for positive in positive_texts:
        for negative in negative_texts:
            yield {"anchor": row.question, "positive": positive, "negative": negative}


def _positives(row: ExportRow, verdict: Verdict) -> list[uuid.UUID]:
    cited = row.cited if verdict.good else ()
    irrelevant = set(verdict.irrelevant)
    return [c for c in dict.fromkeys([*verdict.relevant, *cited]) if c not in irrelevant]


def _negatives(
    row: ExportRow, verdict: Verdict, positives: Sequence[uuid.UUID], depth: int
) -> list[uuid.UUID]:
    rank = {chunk_id: i for i, chunk_id in reversed(list(enumerate(row.ranked)))}
    negatives = set(verdict.irrelevant)
    if verdict.relevant:
        negatives.update(row.ranked[:depth])
    negatives.difference_update(positives)
    # Highest ranked first; judged chunks that were not retrieved come last, as judged.
    order = {c: i for i, c in enumerate(verdict.irrelevant)}
    unranked = len(row.ranked)
    return sorted(negatives, key=lambda c: (rank.get(c, unranked), order.get(c, 0)))
