"""Exports as pure functions of rows: merging feedback, what each format keeps and skips, the
preference pairs, hard negatives; and the checks feedback passes before it is stored."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ragservice.errors import InvalidInputError
from ragservice.feedback.collect import MAX_FEEDBACK_CHARS, FeedbackInput, checked, is_bad, is_good
from ragservice.feedback.exports import (
    Pair,
    merge_feedback,
    openai_dpo_record,
    preference_pairs,
    row_triplets,
    sft_record,
    trl_dpo_record,
)
from ragservice.store.feedback import ExportRow, FeedbackEntry

T0 = datetime(2026, 1, 1, tzinfo=UTC)
A, B, C, D, E = (uuid.UUID(int=i) for i in range(1, 6))
TEXT = {A: "alpha", B: "bravo", C: "charlie", D: "delta", E: "echo"}
SYSTEM = {"role": "system", "content": "Answer from the sources."}


def entry(minute: int = 0, **given: Any) -> FeedbackEntry:
    return FeedbackEntry(
        rating=given.get("rating"),
        scale=given.get("scale", "thumbs"),
        corrected_answer=given.get("corrected"),
        relevant=tuple(given.get("relevant", ())),
        irrelevant=tuple(given.get("irrelevant", ())),
        created_at=T0 + timedelta(minutes=minute),
    )


def row(*feedback: FeedbackEntry, **given: Any) -> ExportRow:
    question = given.get("question", "What is alpha?")
    return ExportRow(
        query_id=given.get("query_id", uuid.uuid4()),
        question=question,
        answer=given.get("answer", "Alpha is first [1]."),
        status=given.get("status", "ok"),
        messages=given.get("messages", [SYSTEM, {"role": "user", "content": question}]),
        ranked=tuple(given.get("ranked", (A, B, C, D))),
        cited=tuple(given.get("cited", (A,))),
        collection_ids=tuple(given.get("collections", (uuid.UUID(int=99),))),
        created_at=T0,
        feedback=feedback,
        chunk_texts=given.get("texts", TEXT),
        question_key=given.get("key", question.lower().rstrip("?")),
    )


# -- merging -------------------------------------------------------------------------------------


def test_the_latest_value_of_each_field_wins() -> None:
    verdict = merge_feedback(
        [
            entry(0, rating=1, corrected="better", relevant=[A, B]),
            entry(1, rating=2, scale="stars", irrelevant=[A]),
            entry(2, relevant=[C]),  # chunks only: the rating and correction stand
        ]
    )
    assert (verdict.rating, verdict.scale) == (2, "stars")
    assert verdict.corrected_answer == "better"
    assert verdict.relevant == (B, C)
    assert verdict.irrelevant == (A,)
    assert verdict.bad and not verdict.good


@pytest.mark.parametrize(
    ("rating", "scale", "good", "bad"),
    [
        (1, "thumbs", True, False),
        (-1, "thumbs", False, True),
        (5, "stars", True, False),
        (4, "stars", True, False),
        (3, "stars", False, False),
        (2, "stars", False, True),
        (None, "stars", False, False),
    ],
)
def test_good_and_bad_ratings(rating: int | None, scale: str, good: bool, bad: bool) -> None:
    assert (is_good(rating, scale), is_bad(rating, scale)) == (good, bad)


# -- supervised fine-tuning ----------------------------------------------------------------------


def test_sft_teaches_the_correction_over_the_answer() -> None:
    record = sft_record(row(entry(rating=-1, corrected="Alpha is the first letter [1].")))
    assert record == {
        "messages": [
            SYSTEM,
            {"role": "user", "content": "What is alpha?"},
            {"role": "assistant", "content": "Alpha is the first letter [1]."},
        ]
    }


def test_sft_keeps_earlier_turns_and_only_role_and_content() -> None:
    messages = [
        SYSTEM,
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", "name": "bot"},
        {"role": "user", "content": "What is alpha?"},
    ]
    record = sft_record(row(entry(rating=5, scale="stars"), messages=messages))
    assert record is not None
    assert [m["role"] for m in record["messages"]] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert record["messages"][2] == {"role": "assistant", "content": "Hello"}
    assert record["messages"][-1]["content"] == "Alpha is first [1]."


@pytest.mark.parametrize(
    ("feedback", "given"),
    [
        (entry(rating=-1), {}),  # badly rated, not corrected
        (entry(rating=3, scale="stars"), {}),  # lukewarm
        (entry(relevant=[A]), {}),  # chunks judged, answer not
        (entry(rating=1), {"messages": None}),  # a cache replay: no prompt to teach from
        (entry(rating=1), {"status": "upstream_error"}),
        (entry(rating=1), {"answer": "  "}),
    ],
)
def test_sft_skips_what_has_nothing_good_to_teach(
    feedback: FeedbackEntry, given: dict[str, Any]
) -> None:
    assert sft_record(row(feedback, **given)) is None


# -- preference pairs ----------------------------------------------------------------------------


def test_a_correction_is_preferred_over_the_answer_it_corrects() -> None:
    pairs = list(preference_pairs([row(entry(rating=-1, corrected="Right."), answer="Wrong.")]))
    prompt = [SYSTEM, {"role": "user", "content": "What is alpha?"}]
    assert pairs == [Pair(prompt=prompt, chosen="Right.", rejected="Wrong.")]


def test_well_rated_answers_are_preferred_over_badly_rated_ones_to_the_same_question() -> None:
    good_prompt = [SYSTEM, {"role": "user", "content": "good context"}]
    rows = [
        row(entry(rating=-1), answer="Bad one."),
        row(entry(rating=4, scale="stars"), answer="Good, older."),
        row(entry(rating=1), answer="Good, newer.", messages=good_prompt),
        row(entry(rating=1, scale="stars"), answer="Bad two."),
        row(entry(rating=-1), answer="Other question.", key="what is bravo"),
    ]
    pairs = list(preference_pairs(rows))
    assert pairs == [
        Pair(prompt=good_prompt, chosen="Good, newer.", rejected="Bad one."),
        Pair(prompt=good_prompt, chosen="Good, newer.", rejected="Bad two."),
    ]


def test_answers_over_other_collections_are_not_compared() -> None:
    other = (uuid.UUID(int=100),)
    rows = [row(entry(rating=1), answer="Good."), row(entry(rating=-1), collections=other)]
    assert list(preference_pairs(rows)) == []


def test_record_shapes_of_the_preference_formats() -> None:
    pair = Pair(prompt=[{"role": "user", "content": "q"}], chosen="yes", rejected="no")
    assert openai_dpo_record(pair) == {
        "input": {"messages": [{"role": "user", "content": "q"}]},
        "preferred_output": [{"role": "assistant", "content": "yes"}],
        "non_preferred_output": [{"role": "assistant", "content": "no"}],
    }
    assert trl_dpo_record(pair) == {
        "prompt": [{"role": "user", "content": "q"}],
        "chosen": [{"role": "assistant", "content": "yes"}],
        "rejected": [{"role": "assistant", "content": "no"}],
    }
    assert json.loads(json.dumps(trl_dpo_record(pair))) == trl_dpo_record(pair)


# -- triplets ------------------------------------------------------------------------------------


def negatives(rows: list[dict[str, str]]) -> list[str]:
    return [r["negative"] for r in rows]


def test_relevant_chunks_pair_with_the_highest_ranked_others() -> None:
    found = list(row_triplets(row(entry(relevant=[C])), negatives_per_positive=2))
    assert found == [
        {"anchor": "What is alpha?", "positive": "charlie", "negative": "alpha"},
        {"anchor": "What is alpha?", "positive": "charlie", "negative": "bravo"},
    ]


def test_marked_irrelevant_chunks_are_negatives_in_rank_order_unranked_last() -> None:
    feedback = entry(relevant=[A], irrelevant=[E, C])
    found = list(row_triplets(row(feedback, ranked=(A, B, C, D)), negatives_per_positive=10))
    assert negatives(found) == ["bravo", "charlie", "delta", "echo"]


def test_ranked_chunks_are_negatives_only_when_some_chunk_was_marked_relevant() -> None:
    # A thumbs up makes the cited chunk a positive, but nothing was judged irrelevant.
    assert list(row_triplets(row(entry(rating=1)))) == []
    found = list(row_triplets(row(entry(rating=1, irrelevant=[D]))))
    assert found == [{"anchor": "What is alpha?", "positive": "alpha", "negative": "delta"}]


def test_hard_negatives_come_from_the_top_of_the_ranking_only() -> None:
    ranked = (A, B, C, D, E)
    found = list(row_triplets(row(entry(relevant=[A]), ranked=ranked), depth=2))
    assert negatives(found) == ["bravo"]


def test_cited_chunks_count_only_for_well_rated_answers() -> None:
    bad = list(row_triplets(row(entry(rating=-1, irrelevant=[D]), cited=(B,))))
    assert bad == []
    good = list(row_triplets(row(entry(rating=1, irrelevant=[D]), cited=(B,))))
    assert [r["positive"] for r in good] == ["bravo"]


def test_missing_texts_and_identical_texts_are_skipped() -> None:
    texts = {A: "same", B: "same", C: "charlie"}  # D was deleted since
    found = list(row_triplets(row(entry(relevant=[A], irrelevant=[D]), texts=texts)))
    assert found == [{"anchor": "What is alpha?", "positive": "same", "negative": "charlie"}]


def test_triplets_have_exactly_the_three_string_columns() -> None:
    found = list(row_triplets(row(entry(relevant=[A, B]))))
    assert len(found) == 4  # two positives, each with C and D
    assert all(list(r) == ["anchor", "positive", "negative"] for r in found)
    assert all(isinstance(v, str) for r in found for v in r.values())


# -- checks on feedback --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"rating": 0}, "rating: 0 is not a thumbs rating (+1 or -1)"),
        ({"rating": 4}, "rating: 4 is not a thumbs rating"),
        ({"rating": 6, "scale": "stars"}, "rating: 6 is not a stars rating (1 to 5)"),
        ({"rating": -1, "scale": "stars"}, "is not a stars rating"),
        ({}, "give at least one of rating, comment"),
        ({"comment": "   "}, "give at least one of"),
        ({"relevant_chunk_ids": [A], "irrelevant_chunk_ids": [B, A]}, f"chunk {A} is marked both"),
        ({"comment": "x" * (MAX_FEEDBACK_CHARS + 1)}, "comment: 20001 characters; the limit is"),
        ({"corrected_answer": "y" * (MAX_FEEDBACK_CHARS + 1)}, "corrected_answer: 20001"),
        ({"relevant_chunk_ids": [uuid.UUID(int=i) for i in range(201)]}, "at most 200"),
    ],
)
def test_feedback_that_is_refused(given: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        checked(FeedbackInput(**given))


def test_feedback_is_cleaned() -> None:
    cleaned = checked(
        FeedbackInput(rating=5, scale="stars", comment=" ", relevant_chunk_ids=[A, B, A])
    )
    assert cleaned.comment is None
    assert cleaned.relevant_chunk_ids == (A, B)
    assert checked(FeedbackInput(rating=-1)).rating == -1
    assert checked(FeedbackInput(corrected_answer="x" * MAX_FEEDBACK_CHARS)).corrected_answer
