"""Prompt-cache workloads built from SciFact claims, and an offline study of the match threshold.

    python benchmarks/cache_workload.py --data ../shared/data/scifact [--seed 0]

The builders are pure and deterministic for a given `random.Random`; `benchmarks/cache.py` imports
them to drive the HTTP benchmark:

- `load_claims(data)`: the SciFact claims, in file order, exact duplicates dropped;
- `should_hit_variants(claims, rng)`: (original, variant) that must be served from the cache;
- `meaning_changed_pairs(claims)`: (a, b, kind) of different claims that read almost alike, which
  must never be served for each other;
- `unrelated_pairs(claims, rng, n)`: (a, b) of random different claims;
- `wrap(claim, rng)`: the claim inside a request framing people type around a question ("Can you
  tell me whether …?", "Hey, quick question: …", "… ? Thanks!"), from `WRAPPINGS`.

Run as a script it embeds every prompt with all-MiniLM-L6-v2 and prints, per cosine threshold,
the share of should-hit variants matched, and of meaning-changed pairs falsely matched, with and
without `meaning_differs`; then a final JSON line with the recommended threshold.
"""

from __future__ import annotations

import argparse
import difflib
import json
import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ragservice.cache.guard import meaning_differs, normalize_prompt

THRESHOLDS = (0.80, 0.85, 0.88, 0.90, 0.92, 0.94, 0.96, 0.98)
MAX_FALSE_HIT_RATE = 0.01
MIN_SHOULD_HIT_RATE = 0.90
MIN_RATIO = 0.8  # difflib ratio for "reads almost alike"
_MIN_JACCARD = 0.4  # cheap prefilter: pairs under it never reach a ratio of 0.8 in SciFact

Pair = tuple[str, str]


def load_claims(data: Path) -> list[str]:
    """The claim texts of `data/queries.jsonl` (a BEIR folder), file order, duplicates dropped."""
    seen: dict[str, None] = {}
    with (data / "queries.jsonl").open(encoding="utf-8") as lines:
        for line in lines:
            text = str(json.loads(line)["text"]).strip()
            if text:
                seen.setdefault(text, None)
    return list(seen)


def should_hit_variants(claims: Sequence[str], rng: random.Random) -> list[Pair]:
    """One (original, variant) per claim: a case, punctuation or filler change, chosen by `rng`."""
    return [(claim, rng.choice(_REWORDINGS)(claim)) for claim in claims]


def _sentence(claim: str) -> str:
    return claim.rstrip(" .")


def _lower_first(claim: str) -> str:
    # "BRCA1 …" and "APOE4 …" keep their case; only a capitalised ordinary word is lowered.
    if len(claim) > 1 and claim[0].isupper() and claim[1].islower():
        return claim[0].lower() + claim[1:]
    return claim


_REWORDINGS: tuple[Callable[[str], str], ...] = (
    lambda c: c.lower(),
    lambda c: c.upper(),
    lambda c: "  ".join(_sentence(c).split()) + " ",
    lambda c: _sentence(c) + "?",
    lambda c: f'"{_sentence(c)}"',
    lambda c: f"Is it true that {_lower_first(_sentence(c))}?",
    lambda c: f"Is it the case that {_lower_first(_sentence(c))}?",
    lambda c: f"Do you know whether {_lower_first(_sentence(c))}?",
    lambda c: f"{_sentence(c)} \u2014 true?",
    lambda c: f"Claim: {c}",
    lambda c: f"True or false: {c}",
)


# Request framings, written as people type them into a chat box; each takes a claim as its
# question. Leading, trailing and both; the cache must treat each like the bare claim.
WRAPPINGS: tuple[Callable[[str], str], ...] = (
    lambda c: f"Can you tell me whether {_lower_first(_sentence(c))}?",
    lambda c: f"Could you please tell me if {_lower_first(_sentence(c))}?",
    lambda c: f"Could you explain whether {_lower_first(_sentence(c))}?",
    lambda c: f"I want to know if {_lower_first(_sentence(c))}.",
    lambda c: f"I'd like to know whether {_lower_first(_sentence(c))}.",
    lambda c: f"I was wondering whether {_lower_first(_sentence(c))}.",
    lambda c: f"Do you happen to know if {_lower_first(_sentence(c))}?",
    lambda c: f"Does anyone know whether {_lower_first(_sentence(c))}?",
    lambda c: f"Hey, quick question: is it true that {_lower_first(_sentence(c))}?",
    lambda c: f"Hi! Can you check whether {_lower_first(_sentence(c))}?",
    lambda c: f"Please confirm whether {_lower_first(_sentence(c))}.",
    lambda c: f"Help me understand whether {_lower_first(_sentence(c))}.",
    lambda c: f"Quick question - {_lower_first(_sentence(c))}?",
    lambda c: f"So, I'm curious whether {_lower_first(_sentence(c))}.",
    lambda c: f"{_sentence(c)}, please?",
    lambda c: f"{_sentence(c)}? Thanks!",
    lambda c: f"{_sentence(c)}? Thanks in advance.",
    lambda c: f"{_sentence(c)} - is that right? Thank you!",
    lambda c: f"{_sentence(c)}? Any ideas?",
    lambda c: f"Hey, could you tell me if {_lower_first(_sentence(c))}? Thanks a lot!",
)


def wrap(claim: str, rng: random.Random) -> str:
    """`claim` inside a request framing chosen by `rng`."""
    return rng.choice(WRAPPINGS)(claim)


def meaning_changed_pairs(claims: Sequence[str]) -> list[tuple[str, str, str]]:
    """(a, b, kind) of different claims whose difflib ratio is at least `MIN_RATIO`.

    Different SciFact claims are different questions, so each pair is a false hit if served for
    the other. `kind` names what differs: negation, prime, number, entity, direction or other.
    Pairs that normalize to the same key are left out: the cache treats them as one prompt.
    """
    lowered = [c.lower() for c in claims]
    tokens = [set(_TOKEN.findall(c)) for c in lowered]
    pairs = []
    for i in range(len(claims)):
        for j in range(i + 1, len(claims)):
            if _jaccard(tokens[i], tokens[j]) < _MIN_JACCARD:
                continue
            if difflib.SequenceMatcher(None, lowered[i], lowered[j]).ratio() < MIN_RATIO:
                continue
            if normalize_prompt(claims[i]) != normalize_prompt(claims[j]):
                pairs.append((claims[i], claims[j], _kind(claims[i], claims[j])))
    return pairs


def unrelated_pairs(claims: Sequence[str], rng: random.Random, n: int) -> list[Pair]:
    """`n` (a, b) of two different claims drawn at random."""
    pairs: list[Pair] = []
    while len(pairs) < n:
        a, b = rng.sample(list(claims), 2)
        if a != b:
            pairs.append((a, b))
    return pairs


_TOKEN = re.compile(r"[\w'\u2032+%.-]+")
# Labels only, kept apart from the guard's own lexicons so the study is not graded by itself.
_NEGATION_CUES = {"not", "no", "never", "none", "without", "lack", "lacks", "nor", "neither"}
_DIRECTION_CUES = re.compile(
    r"^(increas|decreas|reduc|rais|lower|higher|more|less|fewer|greater|inhibit|activat|promot|"
    r"suppress|prevent|induc|enhanc|impair|improv|slow|acceler|stabili|destabili|up|down|"
    r"shorter|longer|smaller|larger|positiv|negativ|block|stimulat)"
)


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def _kind(a: str, b: str) -> str:
    """What differs between two claims, judged on the words one has and the other lacks."""
    left, right = _TOKEN.findall(a), _TOKEN.findall(b)
    changed = {
        t.lower()
        for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, left, right).get_opcodes()
        if op != "equal"
        for t in left[i1:i2] + right[j1:j2]
    }
    if changed & _NEGATION_CUES or any(t.endswith("n't") or t.startswith("un") for t in changed):
        return "negation"
    if any(re.search(r"\d['\u2032]", t) for t in changed):
        return "prime"
    if any(re.fullmatch(r"[\d.,%/-]+", t) for t in changed):
        return "number"
    if any(_DIRECTION_CUES.match(t) for t in changed):
        return "direction"
    if any(
        re.search(r"\d|[A-Z].*[A-Z]", t)
        for t in _TOKEN.findall(a) + _TOKEN.findall(b)
        if t.lower() in changed
    ):
        return "entity"
    return "other"


# ---------------------------------------------------------------------------------------------
# The threshold study.

Vectors = npt.NDArray[np.float32]


def _similarities(pairs: Sequence[Pair], index: dict[str, int], vectors: Vectors) -> Vectors:
    left = vectors[[index[a] for a, _ in pairs]]
    right = vectors[[index[b] for _, b in pairs]]
    sims: Vectors = (left * right).sum(axis=1, dtype=np.float32)
    return sims


def _guarded(pairs: Sequence[Pair]) -> npt.NDArray[np.bool_]:
    # The variant or first claim plays the incoming query, the other the cached prompt.
    return np.array([meaning_differs(query, cached) is None for cached, query in pairs])


def _embed(texts: Sequence[str]) -> Vectors:
    from ragservice.embedding.embedder import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder("sentence-transformers/all-MiniLM-L6-v2", device="cpu")
    embedder.warm_up()
    return np.asarray(embedder.embed(list(texts)), dtype=np.float32)


def _rate(mask: npt.NDArray[np.bool_]) -> float:
    return float(mask.mean()) if mask.size else 0.0


def study(
    hits: Sequence[Pair], changed: Sequence[tuple[str, str, str]], unrelated: Sequence[Pair]
) -> list[dict[str, float]]:
    """One row per threshold: hit and false-hit rates with and without the meaning guard."""
    changed_pairs = [(a, b) for a, b, _ in changed]
    texts = sorted({t for pair in [*hits, *changed_pairs, *unrelated] for t in pair})
    index = {t: i for i, t in enumerate(texts)}
    vectors = _embed(texts)
    exact = np.array([normalize_prompt(a) == normalize_prompt(b) for a, b in hits])
    sims = {
        "hit": _similarities(hits, index, vectors),
        "changed": _similarities(changed_pairs, index, vectors),
        "unrelated": _similarities(unrelated, index, vectors),
    }
    passes = {"hit": _guarded(hits), "changed": _guarded(changed_pairs)}
    negation = np.array([kind == "negation" for _, _, kind in changed])
    rows = []
    for t in THRESHOLDS:
        near = {name: s >= t for name, s in sims.items()}
        rows.append(
            {
                "threshold": t,
                "hit": _rate(exact | (near["hit"] & passes["hit"])),
                "hit_semantic": _rate(near["hit"] & passes["hit"]),
                "hit_unguarded": _rate(exact | near["hit"]),
                "false_hit": _rate(near["changed"] & passes["changed"]),
                "false_hit_unguarded": _rate(near["changed"]),
                "negation_false_hits": float(
                    (near["changed"] & passes["changed"] & negation).sum()
                ),
                "negation_unguarded": float((near["changed"] & negation).sum()),
                "unrelated_false_hit": _rate(near["unrelated"]),
                "exact": _rate(exact),
            }
        )
    return rows


def recommend(rows: Sequence[dict[str, float]]) -> float | None:
    """The lowest threshold meeting both targets: the lowest one serves the most from the cache.

    Judged on the semantic path alone (`hit_semantic`): nearly every variant also matches its
    normalized key exactly, which would hide what the threshold does.
    """
    for row in rows:
        if row["false_hit"] <= MAX_FALSE_HIT_RATE and row["hit_semantic"] >= MIN_SHOULD_HIT_RATE:
            return row["threshold"]
    return None


def _print_table(rows: Sequence[dict[str, float]]) -> None:
    print(
        f"{'t':>5} {'hit':>7} {'hit sem':>8} {'hit noG':>8} {'false':>7} {'false noG':>10}"
        f" {'neg FH':>7} {'neg noG':>8} {'unrel':>7}"
    )
    for r in rows:
        print(
            f"{r['threshold']:>5.2f} {r['hit']:>7.1%} {r['hit_semantic']:>8.1%}"
            f" {r['hit_unguarded']:>8.1%} {r['false_hit']:>7.1%} {r['false_hit_unguarded']:>10.1%}"
            f" {r['negation_false_hits']:>7.0f} {r['negation_unguarded']:>8.0f}"
            f" {r['unrelated_false_hit']:>7.1%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a BEIR folder (SciFact)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--unrelated", type=int, default=2000, help="random pairs to test")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    claims = load_claims(args.data)
    hits = should_hit_variants(claims, rng)
    changed = meaning_changed_pairs(claims)
    unrelated = unrelated_pairs(claims, rng, args.unrelated)
    kinds: dict[str, int] = {}
    for _, _, kind in changed:
        kinds[kind] = kinds.get(kind, 0) + 1
    print(f"{len(claims)} claims, {len(hits)} should-hit variants, {len(changed)} meaning-changed")
    print("meaning-changed pairs by kind:", json.dumps(dict(sorted(kinds.items()))))
    rows = study(hits, changed, unrelated)
    print(f"variants that normalize exactly: {rows[0]['exact']:.1%}")
    _print_table(rows)
    summary = {
        "recommended_threshold": recommend(rows),
        "claims": len(claims),
        "should_hit_variants": len(hits),
        "exact_normalized": round(rows[0]["exact"], 4),
        "meaning_changed_pairs": len(changed),
        "kinds": kinds,
        "rows": rows,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
