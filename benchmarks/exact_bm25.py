"""Exact BM25 with block-max pruning (the `ragservice_bm25` extension) against the SQL statement,
exhaustive and within its per-term postings budget, on the same store.

    python benchmarks/exact_bm25.py --corpus ../shared/data/scifact [--repeat 10]
        [--data-dir DIR] [--queries 300] [--frequent 100] [--k 10] [--budget 2000]

The store: the corpus loaded `--repeat` times under new document ids into one collection with
the null embedder (as `write_path.py` does), packed and optimized; with `--data-dir` it is kept
there and reused by later runs (a marker file says the load finished). Queries: the corpus's own
queries (`queries.jsonl`, the first `--queries`) and `--frequent` queries of 3-5 of the 30 most
frequent lexemes. For each query, in SQL, k = `--k`, candidate seqs only:
- `exhaustive`: the SQL statement (`retrieval.statements.BM25`) with no budget: every posting;
- `budget`: the same statement within `--budget` postings per term (the default setting);
- `exact`: `ragservice_bm25_topk`, with the blocks it read (`ragservice_bm25_last_stats`).
`mismatches` counts queries whose exact top k differs from the exhaustive one (scores compared
to 1e-9; ties at the cut may be any of the tied chunks); `budget_differs` the same for the budget.

The final JSON line: per query set, p50 / p95 ms of each, `mismatches`, `budget_differs`, and
the median share of the query terms' postings the exact search read.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# This folder holds `ingest.py`: keep it off the import path before `ingest` is imported.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from ragservice.config import Settings  # noqa: E402
from ragservice.db import maintenance  # noqa: E402
from ragservice.retrieval import statements  # noqa: E402
from ragservice.runtime import Runtime, open_runtime  # noqa: E402

sys.path.insert(0, str(_HERE))
import write_path  # noqa: E402

COLLECTION = "bench"
LOADED = "exact-bm25-loaded"
K1, B = 1.2, 0.75

_EXACT = (
    "SELECT seq, score FROM ragservice_bm25_topk(%(collections)s::uuid[], "
    "tsvector_to_array(to_tsvector('english'::regconfig, %(query)s)), NULL, %(k)s, "
    "%(k1)s, %(b)s)"
)
_POSTINGS = (
    "SELECT coalesce(sum(n), 0) FROM chunk_postings WHERE collection_id = ANY(%(collections)s) "
    "AND lexeme = ANY(tsvector_to_array(to_tsvector('english'::regconfig, %(query)s)))"
)


def main() -> None:
    args = _parse_args()
    if args.data_dir is not None:
        figures = _run(args, args.data_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="rs-exact-bm25-") as tmp:
            figures = _run(args, Path(tmp))
    print(json.dumps(figures))


def _run(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    settings = Settings(data_dir=data_dir)
    runtime = open_runtime(settings, warm=False)
    try:
        if not (data_dir / LOADED).exists():
            _load(runtime, settings, args)
            (data_dir / LOADED).touch()
        with runtime.db.owner_engine() as engine:
            url = engine.url.render_as_string(hide_password=False)
        with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as conn:
            conn.autocommit = True
            return _measure(conn, args)
    finally:
        runtime.close()


def _load(runtime: Runtime, settings: Settings, args: argparse.Namespace) -> None:
    corpus = args.corpus / "corpus.jsonl" if args.corpus.is_dir() else args.corpus
    load_args = argparse.Namespace(
        no_postings=False, postings_in_sql=False, index="deferred", repeat=args.repeat
    )
    _log(f"loading {corpus} x {args.repeat}")
    write_path._load(runtime, settings, corpus, load_args)
    with runtime.db.owner_engine() as engine:
        maintenance.run_optimize(engine)


def _measure(conn: psycopg.Connection[Any], args: argparse.Namespace) -> dict[str, Any]:
    found = conn.execute("SELECT id FROM collections WHERE name = %s", (COLLECTION,)).fetchone()
    assert found is not None, "no collection to search"
    collections = [found[0]]
    chunks = conn.execute(
        "SELECT count(*) FROM chunks WHERE collection_id = %s", (found[0],)
    ).fetchone()
    queries_file = args.corpus / "queries.jsonl"
    texts = [json.loads(line)["text"] for line in queries_file.open()][: args.queries]
    frequent = _frequent_queries(conn, collections, args.frequent)
    statement = statements.with_ctes(
        statements.bm25(None, args.k),
        select=sql.SQL(
            "SELECT c.seq, r.score FROM ranked r JOIN chunks c ON c.id = r.chunk_id "
            "ORDER BY r.score DESC, r.chunk_id"
        ),
    )
    report: dict[str, Any] = {"chunks": chunks[0] if chunks else 0, "k": args.k}
    for name, qs in (("corpus_queries", texts), ("frequent_lexemes", frequent)):
        _log(f"{name}: {len(qs)} queries")
        report[name] = _compare(conn, collections, qs, statement, args)
    return report


def _compare(
    conn: psycopg.Connection[Any],
    collections: list[Any],
    queries: list[str],
    statement: sql.Composed,
    args: argparse.Namespace,
) -> dict[str, Any]:
    times: dict[str, list[float]] = {"exhaustive": [], "budget": [], "exact": []}
    mismatches = budget_differs = 0
    read_shares: list[float] = []
    for query in queries:
        params = {"collections": collections, "query": query, "k1": K1, "b": B, "k": args.k}
        exhaustive = _timed(conn, statement, params | {"budget": 2**31 - 1}, times["exhaustive"])
        budget = _timed(conn, statement, params | {"budget": args.budget}, times["budget"])
        exact = _timed(conn, _EXACT, params, times["exact"])
        read = conn.execute("SELECT postings_read FROM ragservice_bm25_last_stats()").fetchone()
        total = conn.execute(_POSTINGS, params).fetchone()
        if read and total and total[0]:
            read_shares.append(read[0] / float(total[0]))
        mismatches += not _same_top(exact, exhaustive, args.k)
        budget_differs += not _same_top(budget, exhaustive, args.k)
    figures: dict[str, Any] = {"queries": len(queries), "mismatches": mismatches}
    figures["budget_differs"] = budget_differs
    for name, values in times.items():
        figures[f"{name}_p50_ms"] = round(statistics.median(values), 2)
        figures[f"{name}_p95_ms"] = round(statistics.quantiles(values, n=20)[-1], 2)
    figures["exact_postings_read_median"] = round(statistics.median(read_shares or [0.0]), 3)
    return figures


def _timed(
    conn: psycopg.Connection[Any], statement: Any, params: dict[str, Any], into: list[float]
) -> list[tuple[int, float]]:
    started = time.perf_counter()
    rows = conn.execute(statement, params).fetchall()
    into.append((time.perf_counter() - started) * 1000)
    return [(int(row[0]), float(row[1])) for row in rows]


def _same_top(found: list[tuple[int, float]], exhaustive: list[tuple[int, float]], k: int) -> bool:
    """`found` has the exhaustive top k's scores, best first, and every chunk above the cut."""
    expected = sorted(exhaustive, key=lambda row: -row[1])[:k]
    ranked = sorted(found, key=lambda row: -row[1])[: len(expected)]
    if len(ranked) < len(expected):
        return False
    pairs = zip(ranked, expected, strict=True)
    if any(abs(a[1] - b[1]) > 1e-9 * max(1.0, abs(b[1])) for a, b in pairs):
        return False
    cut = expected[-1][1] if expected else 0.0
    above = {seq for seq, score in expected if score > cut + 1e-9 * max(1.0, abs(cut))}
    return above <= {seq for seq, _ in found}


def _frequent_queries(
    conn: psycopg.Connection[Any], collections: list[Any], count: int
) -> list[str]:
    rows = conn.execute(
        "SELECT lexeme FROM chunk_postings WHERE collection_id = ANY(%s) "
        "GROUP BY lexeme ORDER BY sum(n) DESC LIMIT 30",
        (collections,),
    ).fetchall()
    lexemes = [row[0] for row in rows]
    rng = random.Random(7)
    return [" ".join(rng.sample(lexemes, rng.randint(3, 5))) for _ in range(count)]


def _log(message: str) -> None:
    print(f"[exact-bm25] {message}", file=sys.stderr, flush=True)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="BEIR folder")
    parser.add_argument("--repeat", type=int, default=10, help="load the corpus this many times")
    parser.add_argument("--data-dir", type=Path, help="keep (and reuse) the store here")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--frequent", type=int, default=100)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--budget", type=int, default=Settings().search.bm25_postings_per_term)
    return parser.parse_args()


if __name__ == "__main__":
    main()
