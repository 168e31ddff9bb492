"""Request framings ("Can you tell me whether …", "… please") are left out of the cache key and
the meaning guard; the question inside them, its question words, negations and quantities stay."""

from __future__ import annotations

import time

import pytest

from ragservice.cache.framing import strip_framing
from ragservice.cache.guard import meaning_differs, normalize_prompt


@pytest.mark.parametrize(
    "text",
    [
        # leading
        "Can you tell me whether metformin lowers glucose?",
        "could u please tell me if metformin lowers glucose",
        "Would you kindly explain whether metformin lowers glucose?",
        "Please let me know if metformin lowers glucose.",
        "I want to know whether metformin lowers glucose.",
        "I'd really like to understand if metformin lowers glucose",
        "We need to find out whether metformin lowers glucose.",
        "I'm wondering if metformin lowers glucose.",
        "I wonder whether metformin lowers glucose",
        "Did anyone here happen to know if metformin lowers glucose?",
        "anybody know if metformin lowers glucose?",
        "Any idea whether metformin lowers glucose?",
        "I'd be grateful if someone could confirm whether metformin lowers glucose.",
        "Help me understand whether metformin lowers glucose.",
        "Hi there! Is it true that metformin lowers glucose?",
        "hey can you tell me: metformin lowers glucose?",
        "Okay so, quick question: metformin lowers glucose?",
        "One simple question for you - metformin lowers glucose?",
        "My question is: metformin lowers glucose?",
        "Just wondering, metformin lowers glucose?",
        # trailing
        "Metformin lowers glucose, please.",
        "metformin lowers glucose pls",
        "Metformin lowers glucose? Thanks so much!!",
        "Metformin lowers glucose? Thank you in advance.",
        "Metformin lowers glucose (thanks)",
        "Metformin lowers glucose? Anyone?",
        "Metformin lowers glucose, if you know.",
        "Metformin lowers glucose, just curious.",
        # both, and stacked with the older fillers
        "Hello, could you tell me whether metformin lowers glucose? Many thanks!",
        "Hey, quick question: can you confirm: is it true that metformin lowers glucose? Thx",
    ],
)
def test_a_framed_question_keys_like_the_bare_one(text: str) -> None:
    assert normalize_prompt(text) == "metformin lowers glucose"
    assert meaning_differs(text, "Metformin lowers glucose.") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # question words stay
        ("Could you explain why metformin lowers glucose?", "why metformin lowers glucose"),
        ("Tell me how metformin lowers glucose, please", "how metformin lowers glucose"),
        ("I was wondering: when should metformin be taken?", "when should metformin be taken"),
        ("I'm curious how metformin works", "how metformin works"),
        ("Do you know what metformin does?", "what metformin does"),
        # negations stay
        (
            "Can you tell me if metformin does not lower glucose?",
            "metformin does not lower glucose",
        ),
        ("I want to know whether metformin doesn't work. Thanks", "metformin doesn't work"),
        ("Please explain why not metformin?", "why not metformin"),
        # quantities stay
        ("Tell me how many patients relapse, please", "how many patients relapse"),
        ("I'd like to know if fewer than 5% relapse", "fewer than 5% relapse"),
        ("Could you check whether 2 doses suffice? Thanks!", "2 doses suffice"),
        # "tell me about X" asks about X
        ("Tell me about metformin and glucose", "metformin and glucose"),
    ],
)
def test_what_follows_a_framing_is_kept(text: str, expected: str) -> None:
    assert normalize_prompt(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Can you take aspirin with ibuprofen?",  # "can you" without a verb of asking is content
        "Can't you tell me whether metformin lowers glucose",  # not a framing we know
        "Curious George is a monkey",
        "Hey Jude is a song",
        "Well water contains arsenic",
        "Was metformin tested on anyone?",
        "How to please a cat",
        "Why do we say thank you",
        "VLDL lacking arachidonoyl PLs",  # phospholipids, not "please"
        "Stroke or TIA",
        "Can you tell me?",  # nothing would be left
        "Thanks",
    ],
)
def test_content_that_looks_like_a_framing_is_kept(text: str) -> None:
    assert strip_framing(text) == text


@pytest.mark.parametrize(
    ("query", "cached", "reason"),
    [
        (
            "Can you tell me whether metformin does not lower glucose?",
            "Metformin lowers glucose.",
            "negation",
        ),
        (
            "Hey, quick question: does metformin raise glucose? Thanks",
            "Metformin lowers glucose.",
            "direction",
        ),
        (
            "I'd like to know if 10% of patients relapse, please.",
            "5% of patients relapse.",
            "number",
        ),
        (
            "Could you tell me if BRCA2 mutations cause cancer?",
            "BRCA1 mutations cause cancer.",
            "entity",
        ),
        (
            "Please explain whether sitagliptin lowers glucose.",
            "Metformin lowers glucose.",
            "content",
        ),
    ],
)
def test_a_framed_question_with_another_meaning_is_still_refused(
    query: str, cached: str, reason: str
) -> None:
    assert meaning_differs(query, cached) == reason
    assert normalize_prompt(query) != normalize_prompt(cached)


M = 20_000  # words: a quadratic pattern would take minutes here


@pytest.mark.parametrize(
    "text",
    [
        "hey " * M + "x",
        "a " * M + "question",
        "please " * M + "tell",
        "x" + "!" * M + "please x",
        "x, thanks" + "!" * M + "x",
        "x" + ", anyone" * M + " x",
        "i was " + "just " * M + "wondering",
    ],
)
def test_long_inputs_cost_linear_time(text: str) -> None:
    started = time.perf_counter()
    assert strip_framing(text) in text
    normalize_prompt(text)
    assert time.perf_counter() - started < 2.0
