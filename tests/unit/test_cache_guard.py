"""`cache/guard.py`, the prompt cache's text layer: the normalized key, its hash, and the
meaning guard."""

from __future__ import annotations

import time

import pytest

from ragservice.cache.guard import meaning_differs, normalize_prompt, prompt_hash


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  BRCA1   Increases\tRisk  ", "brca1 increases risk"),
        ("Vitamin D, in men; lowers risk!", "vitamin d in men lowers risk"),
        ("\uff21\uff22\uff23 \ufb01ne", "abc fine"),  # NFKC: full-width letters, the fi ligature
        ("It \u2018works\u2019 \u201cwell\u201d", "it works well"),
        ("Is it true that X lowers Y?", "x lowers y"),
        ("Is it the case that X lowers Y?", "x lowers y"),
        ("Do you know whether X lowers Y?", "x lowers y"),
        ("True or false: X lowers Y.", "x lowers y"),
        ("Claim: X lowers Y.", "x lowers y"),
        ("X lowers Y \u2014 true?", "x lowers y"),
        ("The opposite is true?", "the opposite is true"),
        ("2.5% of 1,000 patients.", "2.5% of 1,000 patients"),
        ("CD4+ and CD8- T cells", "cd4+ and cd8- t cells"),
        ("TNF-\u03b1 and TNF-alpha", "tnf-alpha and tnf-alpha"),
        ("The 3\u2032 end and the 5' end", "the 3' end and the 5' end"),
        ("CTLA - 4 doesn\u2019t bind", "ctla-4 doesn't bind"),
        ("<5% of cells", "<5% of cells"),
    ],
)
def test_normalize_prompt(text: str, expected: str) -> None:
    assert normalize_prompt(text) == expected


def test_fillers_case_and_punctuation_share_one_key() -> None:
    keys = {
        normalize_prompt(t)
        for t in (
            "Aspirin lowers the risk of stroke.",
            "aspirin lowers the risk of stroke",
            "Is it true that aspirin lowers the risk of stroke?",
            "Claim: Aspirin lowers the risk of stroke.",
        )
    }
    assert keys == {"aspirin lowers the risk of stroke"}


def test_prompt_hash_is_the_sha256_of_the_normalized_text() -> None:
    key = normalize_prompt("Aspirin lowers the risk of stroke.")
    assert prompt_hash(key) == prompt_hash(normalize_prompt("aspirin lowers the risk of stroke"))
    assert prompt_hash("abc") == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )
    assert prompt_hash("abc") != prompt_hash("abd")


@pytest.mark.parametrize(
    ("query", "cached", "reason"),
    [
        ("X increases Y.", "X does not increase Y.", "negation"),
        ("X increases Y.", "X doesn't increase Y.", "negation"),
        ("Mice lacking SVCT2 die.", "Mice with SVCT2 die.", "negation"),
        ("The drug is effective.", "The drug is ineffective.", "negation"),
        ("X increases Y.", "X decreases Y.", "direction"),
        ("PGE 2 suppresses tumor growth.", "PGE 2 promotes tumor growth.", "direction"),
        ("Rates are higher in men.", "Rates are lower in men.", "direction"),
        ("X upregulates Y.", "X downregulates Y.", "direction"),
        ("5% of patients relapse.", "10% of patients relapse.", "number"),
        ("2.5 mg daily works.", "25 mg daily works.", "number"),
        ("BRCA1 mutations cause cancer.", "BRCA2 mutations cause cancer.", "entity"),
        ("IL-10 is anti-inflammatory.", "IL-6 is anti-inflammatory.", "entity"),
        ("TNF-\u03b1 drives sepsis.", "TNF-\u03b2 drives sepsis.", "entity"),
        ("CD4+ cells expand.", "CD8+ cells expand.", "entity"),
        ("It binds the 3\u2032 end.", "It binds the 5\u2032 end.", "entity"),
        ("Albendazole treats filariasis.", "Ivermectin treats filariasis.", "content"),
        ("Men are bullied more than women.", "Women are bullied more than men.", "order"),
        ("Klf4 is important for growth.", "Klf4 is not important for growth.", "negation"),
    ],
)
def test_guard_refuses_a_changed_meaning(query: str, cached: str, reason: str) -> None:
    assert meaning_differs(query, cached) == reason
    assert meaning_differs(cached, query) == reason


@pytest.mark.parametrize(
    ("query", "cached"),
    [
        ("brca1 mutations cause cancer", "BRCA1 mutations cause cancer."),
        (
            "tnf-alpha drives sepsis in apoe4 carriers",
            "TNF-\u03b1 drives sepsis in APOE4 carriers.",
        ),
        ("LRBA PREVENTS CTLA-4 RECYCLING", "LRBA prevents CTLA - 4 recycling."),
        ("Is it true that aspirin lowers stroke risk?", "Aspirin lowers stroke risk."),
        ("Claim: Aspirin lowers stroke risk", "aspirin lowers stroke risk"),
        ("Aspirin lowers stroke risk \u2014 true?", "Aspirin lowers stroke risk."),
        ("Does aspirin lower stroke risk?", "Aspirin lowers stroke risk."),
        ("Aspirin significantly lowers stroke risk.", "Aspirin lowers stroke risk."),
    ],
)
def test_guard_passes_the_same_meaning(query: str, cached: str) -> None:
    assert meaning_differs(query, cached) is None


def test_guard_is_cheap() -> None:
    query = "Is it true that female carriers of the APOE4 allele have decreased risk for dementia?"
    cached = "Female carriers of the Apolipoprotein E4 (APOE4) allele have decreased dementia risk."
    # This thread's CPU time, not the wall clock: on a busy machine the wall clock also counts
    # the time other processes held the core (a run with two suites beside it took 1.03 ms).
    meaning_differs(query, cached)  # the patterns compiled once, as in a running server
    start = time.thread_time()
    for _ in range(200):
        meaning_differs(query, cached)
    assert (time.thread_time() - start) / 200 < 1e-3


def test_comparison_symbols_and_sharps_survive_normalization() -> None:
    from ragservice.cache.guard import normalize_prompt

    assert normalize_prompt("x > y?") != normalize_prompt("x < y?")
    assert normalize_prompt("What about C#?") != normalize_prompt("What about C?")
    assert normalize_prompt("Is it true that x > y?") == normalize_prompt("x > y")


@pytest.mark.parametrize(
    "text",
    [
        "X lowers Y, true or false?",
        "X lowers Y (right)?",
        "X lowers Y is that correct?",
        "X lowers Y true or false ??",
        "X lowers Y - TRUE ) ?",
        "Claim: X lowers Y, is it true?",
        "X lowers Y; correct?",
        "X lowers Y is it right ?",
    ],
)
def test_every_filler_suffix_is_stripped(text: str) -> None:
    assert normalize_prompt(text) == "x lowers y"


# Long whitespace runs. Where no filler suffix ends the text, its regex backtracked
# quadratically: 11 s at 20,000 spaces, so about 5 minutes at 100,000; now a fraction of a
# second. The bound only has to catch that. The last two have a suffix to strip.
M = 100_000


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a" + " " * M + "b", "a b"),
        ("a" + "\t" * M + "b?", "a b"),
        ("X lowers Y - true" + " " * M + "x", "x lowers y-true x"),
        ("X, true" + " " * M + "or" + " " * M + "false" + " " * M + "!", "x true or false"),
        ("true" + " " * M + "or" + " " * M + "x", "true or x"),
        ("X lowers Y" + " " * M + "- true" + " " * M + ")" + " " * M + "?" + " " * M, "x lowers y"),
        ("X" + " " * M + "is" + " " * M + "that" + " " * M + "true?", "x"),
    ],
)
def test_long_whitespace_runs_cost_linear_time(text: str, expected: str) -> None:
    started = time.perf_counter()
    assert normalize_prompt(text) == expected
    assert meaning_differs(text, text) is None
    assert meaning_differs(text, "X does not lower Y") is not None
    assert time.perf_counter() - started < 2.0
