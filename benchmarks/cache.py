"""The semantic prompt cache over HTTP: what it serves, what it refuses, and what it costs.

    python benchmarks/cache.py --data ../shared/data/scifact [--url URL]

Uses the server and corpus set-up of `eval_beir.py`. The workload comes from the SciFact claims
(`cache_workload.py`): should-hit variants of claims (case, punctuation, whitespace, "Is it true
that …?" and light rewordings), should-miss pairs of near-identical claims whose meaning differs
(found by string similarity), and unrelated pairs. Then the same inside request framings
(`cache_workload.WRAPPINGS`: "Can you tell me whether …?", "… ? Thanks!"): claims asked bare and
then wrapped, which should hit, and each meaning-changed pair with its second claim wrapped,
which must still miss. For each pair the first prompt is asked
(a miss that fills the cache) and then the second; the server's own `timings_ms` give the
latencies. Finally a replay of Zipf-distributed repeats of the test claims measures the share of
requests that still reached retrieval. The cache of the collection is purged before each pair
and before the replay.
Prints a table and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# This folder goes last on the import path: `benchmarks/ingest.py` must not shadow `ingest`.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]

from cache_workload import (  # noqa: E402
    load_claims,
    meaning_changed_pairs,
    should_hit_variants,
    unrelated_pairs,
    wrap,
)
from harness import add_common_arguments, connect, ensure_corpus, parse, server  # noqa: E402

from ragservice.client import RagserviceClient  # noqa: E402
from ragservice.embedding.evaluation import load_beir_queries  # noqa: E402

# The server stores an answer in the cache after its response is sent; a pair's second question
# (and the next pair's purge) waits this long so that the store has landed.
SETTLE_SECONDS = 0.05


def main() -> None:
    args = _parse_args()
    rng = random.Random(args.seed)
    claims = load_claims(args.data)
    hit_pairs = _should_hit(claims, rng, args.sample)
    changed = meaning_changed_pairs(claims)
    unrelated = unrelated_pairs(claims, rng, args.sample)
    # Its own generator, so the sets above and the replay stay those of earlier runs.
    framing_rng = random.Random(args.seed + 1)
    sampled = framing_rng.sample(claims, min(args.sample, len(claims)))
    wrapped = [(c, wrap(c, framing_rng), "wrapped") for c in sampled]
    wrapped_changed = [(a, wrap(b, framing_rng), kind) for a, b, kind in changed]
    tests = list(load_beir_queries(args.data, args.split).texts.values())
    with (
        server(args) as (base, headers),
        connect(base, headers) as client,
    ):
        ensure_corpus(client, args.collection, args.data / "corpus.jsonl")
        bench = _Bench(client, args.collection)
        hits = bench.pairs([(a, b, kind) for a, b, kind in hit_pairs])
        misses = bench.pairs(changed)
        unrelated_rows = bench.pairs([(a, b, "unrelated") for a, b in unrelated])
        framed = {"hits": bench.pairs(wrapped), "misses": bench.pairs(wrapped_changed)}
        replay = bench.replay(tests, rng, args.replay)
    _report(hits, misses, unrelated_rows, framed, replay, bench)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--sample", type=int, default=300, help="should-hit and unrelated pairs")
    parser.add_argument("--replay", type=int, default=1000, help="requests in the Zipf replay")
    parser.add_argument("--seed", type=int, default=7)
    return parse(parser)


def _should_hit(claims: list[str], rng: random.Random, n: int) -> list[tuple[str, str, str]]:
    """Half normalization variants (exact tier), half light rewordings (semantic tier)."""
    chosen = rng.sample(claims, min(n, len(claims)))
    half = len(chosen) // 2
    variants = [(a, b, "variant") for a, b in should_hit_variants(chosen[:half], rng)]
    reworded = [(c, _reword(c, rng), "reworded") for c in chosen[half:]]
    return variants + reworded


def _reword(claim: str, rng: random.Random) -> str:
    """A rewording that keeps the meaning: an article dropped or added, or a hedge."""
    words = claim.rstrip(".").split()
    if "the" in (w.lower() for w in words) and rng.random() < 0.5:
        index = next(i for i, w in enumerate(words) if w.lower() == "the")
        return " ".join(words[:index] + words[index + 1 :]) + "."
    return "In fact, " + claim[0].lower() + claim[1:]


class _Bench:
    def __init__(self, client: RagserviceClient, collection: str) -> None:
        self.client = client
        self.collection = collection
        self.timings: dict[str, list[float]] = {
            "exact": [],
            "semantic": [],
            "miss": [],
            "embed": [],
            "semantic_lookup": [],
        }

    def ask(self, question: str) -> dict[str, Any]:
        answer: dict[str, Any] = dict(
            self.client.answer(question, collections=[self.collection], k=8)
        )
        cache, timings = answer["cache"], answer["timings_ms"]
        if cache["hit"]:
            self.timings[cache["kind"]].append(timings["total"])
            if cache["kind"] == "semantic":
                self.timings["semantic_lookup"].append(timings["cache_lookup"])
        else:
            self.timings["miss"].append(timings["total"])
        if "embed" in timings:
            self.timings["embed"].append(timings["embed"])
        return answer

    def purge(self) -> None:
        self.client.purge_cache(self.collection)

    def pairs(self, pairs: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
        """Each pair alone in the cache: a claim in several pairs must not hit itself."""
        rows = []
        for first, second, kind in pairs:
            self.purge()
            self.ask(first)
            time.sleep(SETTLE_SECONDS)
            cache = self.ask(second)["cache"]
            time.sleep(SETTLE_SECONDS)
            rows.append({"kind": kind, "hit": cache["hit"], "how": cache["kind"]})
        return rows

    def replay(self, tests: list[str], rng: random.Random, n: int) -> dict[str, float]:
        """Zipf(1.1) over the test claims: a few asked often, most rarely."""
        self.purge()
        weights = [1 / (rank + 1) ** 1.1 for rank in range(len(tests))]
        stream = rng.choices(tests, weights=weights, k=n)
        misses = sum(not self.ask(question)["cache"]["hit"] for question in stream)
        return {"requests": n, "distinct": len(set(stream)), "reached_retrieval": misses / n}


def _rate(rows: list[dict[str, Any]], **where: Any) -> float:
    chosen = [row for row in rows if all(row[k] == v for k, v in where.items())]
    return round(sum(row["hit"] for row in chosen) / len(chosen), 4) if chosen else 0.0


def _kinds(rows: list[dict[str, Any]], key: str) -> dict[str, int]:
    """How many hits each cache tier served ("exact", "semantic")."""
    counts: dict[str, int] = {}
    for row in rows:
        if row["hit"]:
            counts[str(row[key])] = counts.get(str(row[key]), 0) + 1
    return counts


def _p50(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def _report(
    hits: list[dict[str, Any]],
    misses: list[dict[str, Any]],
    unrelated: list[dict[str, Any]],
    framed: dict[str, list[dict[str, Any]]],
    replay: dict[str, float],
    bench: _Bench,
) -> None:
    kinds = sorted({row["kind"] for row in misses})
    summary = {
        "threshold_pairs": {"should_hit": len(hits), "should_miss": len(misses)},
        "hit_rate_should_hit": _rate(hits),
        "hit_rate_variants": _rate(hits, kind="variant"),
        "hit_rate_reworded": _rate(hits, kind="reworded"),
        "false_hit_rate_should_miss": _rate(misses),
        "false_hits_by_kind": {k: sum(r["hit"] for r in misses if r["kind"] == k) for k in kinds},
        "pairs_by_kind": {k: sum(r["kind"] == k for r in misses) for k in kinds},
        "negation_false_hits": sum(r["hit"] for r in misses if r["kind"] == "negation"),
        "false_hit_rate_unrelated": _rate(unrelated),
        "wrapped_pairs": {"should_hit": len(framed["hits"]), "should_miss": len(framed["misses"])},
        "hit_rate_wrapped": _rate(framed["hits"]),
        "wrapped_hits_by_kind": _kinds(framed["hits"], "how"),
        "false_hit_rate_wrapped_should_miss": _rate(framed["misses"]),
        "wrapped_false_hits_by_kind": {
            k: sum(r["hit"] for r in framed["misses"] if r["kind"] == k) for k in kinds
        },
        "exact_hit_p50_ms": _p50(bench.timings["exact"]),
        "semantic_hit_p50_ms": _p50(bench.timings["semantic"]),
        "semantic_lookup_beyond_embed_p50_ms": _p50(bench.timings["semantic_lookup"]),
        "miss_p50_ms": _p50(bench.timings["miss"]),
        "embed_p50_ms": _p50(bench.timings["embed"]),
        "replay": replay,
    }
    for key, value in summary.items():
        print(f"{key:<40}{value}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
