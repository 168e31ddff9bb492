"""Retrieval quality and SQL latency of `Searcher` on a BEIR dataset, at several settings.

    python benchmarks/search_sql.py --data ../shared/data/scifact [--data-dir DIR] [--only ROWS]

The corpus must already be ingested into `--collection` (default: the dataset folder's name):

    RAGSERVICE_DATA_DIR=DIR ragservice ingest ../shared/data/scifact/corpus.jsonl -c scifact

Every judged query is searched once per row of settings:

- quality: k = `--depth` chunks; documents rank by their best chunk; nDCG@10 and recall@10 as
  BEIR (pytrec_eval) defines them (`ragservice.embedding.evaluation`);
- latency: k = 10, one search at a time, p50 / p95 of `Searcher.search` wall time. Query vectors
  are computed once up front, so these figures are SQL plus Python, without the model. The
  last row searches hybrid with the query embedded on every call by the service's own query
  encoder, as the API does (the full-text side then runs while the query is embedded).

Prints a table and a final JSON line. Read-only: nothing is written to the database.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

# Keep this folder off the import path: `benchmarks/ingest.py` would shadow the `ingest` package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402

from ragservice import store  # noqa: E402
from ragservice.config import Settings  # noqa: E402
from ragservice.db import tenancy  # noqa: E402
from ragservice.embedding.evaluation import (  # noqa: E402
    BeirQueries,
    load_beir_queries,
    mean,
    ndcg_at_k,
    rank_documents,
    recall_at_k,
)
from ragservice.retrieval.search import Mode, Searcher, SearchOptions  # noqa: E402
from ragservice.runtime import Runtime, open_runtime  # noqa: E402

LATENCY_K = 10
Vector = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Row:
    label: str
    options: SearchOptions
    embed_per_query: bool = False


@dataclass(frozen=True)
class Figures:
    label: str
    mode: str
    settings: str
    ndcg_at_10: float
    recall_at_10: float
    p50_ms: float
    p95_ms: float
    stages_p50_ms: dict[str, float]


def main() -> None:
    args = _parse_args()
    queries = load_beir_queries(args.data, args.split)
    settings = Settings(database_url=args.database_url, data_dir=args.data_dir)
    runtime = open_runtime(settings)
    # Outside a request no tenant is set and row-level security hides every row: read as the
    # system (all tenants), as the operator commands do.
    try:
        with tenancy.as_system():
            collection = _collection(runtime, args.collection)
            vectors = _query_vectors(runtime, queries)
            figures = [
                _measure(runtime, row, collection, queries, vectors, args)
                for row in _rows(settings, args.depth)
            ]
    finally:
        runtime.close()
    _print(figures, len(queries.texts), args)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a BEIR dataset folder")
    parser.add_argument("--split", default="test")
    parser.add_argument("--data-dir", type=Path, default=Path(".ragservice"))
    parser.add_argument("--database-url", default=os.environ.get("RAGSERVICE_DATABASE_URL"))
    parser.add_argument("--collection", default=None, help="default: the dataset folder's name")
    parser.add_argument("--depth", type=int, default=30, help="chunks fetched for quality")
    parser.add_argument("--warmup", type=int, default=20, help="untimed queries per row")
    parser.add_argument("--only", default="", help="comma-separated row labels to run")
    args = parser.parse_args()
    args.collection = args.collection or args.data.resolve().name
    return args


def _rows(settings: Settings, depth: int) -> list[Row]:
    """The settings compared: each row changes one thing from the configured defaults."""
    base = SearchOptions.from_settings(settings.search, k=depth)
    dense = replace(base, mode=Mode.DENSE)
    text = replace(base, mode=Mode.FULLTEXT)
    rows = [
        Row("dense ef40", replace(dense, ef_search=40)),
        Row("dense ef100", replace(dense, ef_search=100)),
        Row("fulltext 0.9/0.4", replace(text, bm25_k1=0.9, bm25_b=0.4)),
        Row("fulltext 1.2/0.75", replace(text, bm25_k1=1.2, bm25_b=0.75)),
        Row("hybrid (defaults)", base),
        Row("hybrid rrf10", replace(base, rrf_k=10)),
        Row("hybrid rrf20", replace(base, rrf_k=20)),
        Row("hybrid rrf30", replace(base, rrf_k=30)),
        Row("hybrid rrf100", replace(base, rrf_k=100)),
        Row("hybrid cand50", replace(base, dense_candidates=50, text_candidates=50)),
        Row("hybrid cand200", replace(base, dense_candidates=200, text_candidates=200)),
        Row("hybrid bm25 1.2/0.75", replace(base, bm25_k1=1.2, bm25_b=0.75)),
        Row("hybrid +embed", base, embed_per_query=True),
    ]
    return rows


def _collection(runtime: Runtime, name: str) -> uuid.UUID:
    with runtime.db.read() as session:
        found = store.collections.find_collection_id(session, runtime.default_tenant_id, name)
    if found is None:
        raise SystemExit(
            f"collection {name!r} not found; ingest it first:\n"
            f"  RAGSERVICE_DATA_DIR={runtime.settings.database.data_dir} ragservice ingest "
            f"DATA/corpus.jsonl -c {name}"
        )
    return found


def _query_vectors(runtime: Runtime, queries: BeirQueries) -> dict[str, Vector]:
    texts = list(queries.texts.values())
    return dict(zip(texts, runtime.embedder.embed(texts), strict=True))


def _measure(
    runtime: Runtime,
    row: Row,
    collection: uuid.UUID,
    queries: BeirQueries,
    vectors: dict[str, Vector],
    args: argparse.Namespace,
) -> Figures:
    if args.only and row.label not in args.only.split(","):
        return _skipped(row)
    embed = runtime.embedder.embed_query if row.embed_per_query else vectors.__getitem__
    with _searcher(runtime, embed) as searcher:

        def search(text: str, k: int) -> Any:
            options = replace(row.options, k=k)
            return searcher.search(collection_ids=[collection], query=text, options=options)

        ndcg, recall = [], []
        for query_id, text in queries.texts.items():
            ranked = rank_documents(hit.external_id for hit in search(text, args.depth).hits)
            ndcg.append(ndcg_at_k(ranked, queries.qrels[query_id], 10))
            recall.append(recall_at_k(ranked, queries.qrels[query_id], 10))
        texts = list(queries.texts.values())
        for text in texts[: args.warmup]:
            search(text, LATENCY_K)
        timings = []
        for text in texts:
            started = time.perf_counter()
            result = search(text, LATENCY_K)
            timings.append(((time.perf_counter() - started) * 1000, result.timings_ms))
    return _figures(row, mean(ndcg), mean(recall), timings)


@contextmanager
def _searcher(runtime: Runtime, embed: Callable[[str], Vector]) -> Iterator[Searcher]:
    searcher = Searcher(
        runtime.db, embed, model_id=runtime.model_id, dimension=runtime.embedder.dimension
    )
    with searcher:
        yield searcher


def _figures(
    row: Row, ndcg: float, recall: float, timings: list[tuple[float, dict[str, float]]]
) -> Figures:
    walls = sorted(wall for wall, _ in timings)
    stages = {name for _, stage in timings for name in stage if name != "total"}
    return Figures(
        label=row.label,
        mode=row.options.mode.value,
        settings=_describe(row.options),
        ndcg_at_10=round(ndcg, 4),
        recall_at_10=round(recall, 4),
        p50_ms=round(statistics.median(walls), 2),
        p95_ms=round(walls[int(0.95 * (len(walls) - 1))], 2),
        stages_p50_ms={
            name: round(statistics.median(s[name] for _, s in timings if name in s), 2)
            for name in sorted(stages)
        },
    )


def _skipped(row: Row) -> Figures:
    return Figures(row.label, row.options.mode.value, _describe(row.options), 0, 0, 0, 0, {})


def _describe(options: SearchOptions) -> str:
    ef = options.ef_search or "default"
    parts = {
        Mode.DENSE: f"ef {ef}",
        Mode.FULLTEXT: f"k1 {options.bm25_k1} b {options.bm25_b}",
        Mode.HYBRID: (
            f"rrf {options.rrf_k} cand {options.dense_candidates}/{options.text_candidates} "
            f"ef {ef} k1 {options.bm25_k1} b {options.bm25_b}"
        ),
    }
    return parts[options.mode]


def _print(figures: list[Figures], queries: int, args: argparse.Namespace) -> None:
    ran = [f for f in figures if f.p50_ms > 0]
    print(f"{queries} queries; quality at k={args.depth} chunks, latency at k={LATENCY_K}")
    header = f"{'row':<22} {'settings':<44} {'nDCG@10':>8} {'R@10':>6} {'p50 ms':>7} {'p95 ms':>7}"
    print(header)
    print("-" * len(header))
    for f in ran:
        print(
            f"{f.label:<22} {f.settings:<44} {f.ndcg_at_10:>8.4f} {f.recall_at_10:>6.3f} "
            f"{f.p50_ms:>7.2f} {f.p95_ms:>7.2f}"
        )
    print(json.dumps({"queries": queries, "depth": args.depth, "rows": [asdict(f) for f in ran]}))


if __name__ == "__main__":
    main()
