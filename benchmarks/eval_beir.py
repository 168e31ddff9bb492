"""Retrieval quality and latency of `POST /v1/search` over HTTP on a BEIR dataset.

    python benchmarks/eval_beir.py --data ../shared/data/scifact [--url URL --api-key KEY]

Without `--url` it starts `ragservice serve` on a free loopback port with its own data directory
(`--data-dir`, default `.ragservice-eval`; authentication off, loopback only) and stops it at the
end. The corpus is uploaded once through the API as an ingest job; a later run finds the
collection complete and reuses it. Documents with no text are left out: their count and first
ids go to stderr and to the final JSON (`empty_documents`). Then, for each mode:

- quality: every judged query with k = `--depth` documents (`group_by: "document"`, ranked by
  the server's document score); nDCG@10 and recall@100 as BEIR (pytrec_eval) defines them;
- latency: every query again with k = 10, one request at a time over a kept-alive connection;
  p50 / p95 of the client-side wall time, query embedding included.

`--compare` also evaluates each mode with the ranking defaults before this release
(`OLD_RANKING`: RRF k 30, no feedback, k = `--depth` chunks, documents by their best chunk),
through the request's `ranking` field on the same server, and prints both rows.

Prints a table and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, cast

# This folder goes last on the import path: `benchmarks/ingest.py` must not shadow `ingest`.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]

from harness import (  # noqa: E402
    CorpusCensus,
    add_common_arguments,
    connect,
    ensure_corpus,
    parse,
    percentile,
    server,
)

from ragservice.client import Mode, RagserviceClient, SearchResponse  # noqa: E402
from ragservice.config import Settings  # noqa: E402
from ragservice.embedding.evaluation import (  # noqa: E402
    load_beir_queries,
    mean,
    ndcg_at_k,
    rank_documents,
    recall_at_k,
)

MODES = ("dense", "fulltext", "hybrid")
# The ranking defaults before score-aware fusion, feedback and document scores were measured.
OLD_RANKING: dict[str, Any] = {
    "fusion": "rrf",
    "rrf_k": 30,
    "text_weight": 0.5,
    "adaptive_weight": False,
    "prf": "off",
    "bm25_k1": 0.9,
    "bm25_b": 0.4,
}


def main() -> None:
    args = _parse_args()
    queries = load_beir_queries(args.data, args.split)
    with (
        server(args) as (base, headers),
        connect(base, headers) as client,
    ):
        census = ensure_corpus(client, args.collection, args.data / "corpus.jsonl")
        results = {}
        for mode in args.modes:
            if args.compare:
                results[f"{mode} old"] = _evaluate(client, args, queries, mode, old=True)
            results[mode] = _evaluate(client, args, queries, mode)
    _report(args, results, len(queries.texts), census)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    parser.add_argument("--depth", type=int, default=200, help="results fetched for quality")
    parser.add_argument(
        "--compare", action="store_true", help="also evaluate the old ranking defaults"
    )
    parser.add_argument("--warmup", type=int, default=20, help="untimed queries per mode")
    return parse(parser)


# -- evaluation ------------------------------------------------------------------------------


def _evaluate(
    client: RagserviceClient, args: argparse.Namespace, queries: Any, mode: str, old: bool = False
) -> dict[str, float]:
    texts: dict[str, str] = queries.texts
    ndcg, recall = [], []
    for query_id, text in texts.items():
        hits = _search(client, args.collection, text, mode, args.depth, old)["results"]
        ranked = rank_documents(hit["document"]["external_id"] for hit in hits)
        ndcg.append(ndcg_at_k(ranked, queries.qrels[query_id], 10))
        recall.append(recall_at_k(ranked, queries.qrels[query_id], 100))
    latencies = _latencies(client, args, list(texts.values()), mode, old)
    return {
        "ndcg@10": round(mean(ndcg), 4),
        "recall@100": round(mean(recall), 4),
        "p50_ms": round(statistics.median(latencies), 2),
        "p95_ms": round(percentile(latencies, 0.95), 2),
    }


def _latencies(
    client: RagserviceClient, args: argparse.Namespace, texts: list[str], mode: str, old: bool
) -> list[float]:
    for text in texts[: args.warmup]:
        _search(client, args.collection, text, mode, 10, old)
    timings = []
    for text in texts:
        started = time.perf_counter()
        _search(client, args.collection, text, mode, 10, old)
        timings.append((time.perf_counter() - started) * 1000)
    return timings


def _search(
    client: RagserviceClient, collection: str, query: str, mode: str, k: int, old: bool
) -> SearchResponse:
    """New: documents ranked by the server's defaults; old: chunks by the old defaults (their
    documents then rank by their best chunk)."""
    return client.search(
        query,
        collections=[collection],
        mode=cast(Mode, mode),
        k=k,
        group_by="chunk" if old else "document",
        ranking=OLD_RANKING if old else None,
    )


# -- report ----------------------------------------------------------------------------------


def _report(
    args: argparse.Namespace,
    results: dict[str, dict[str, float]],
    queries: int,
    census: CorpusCensus,
) -> None:
    settings = _server_settings(args)
    print(f"{'mode':<14}{'nDCG@10':>10}{'R@100':>10}{'p50 ms':>10}{'p95 ms':>10}")
    for mode, row in results.items():
        print(
            f"{mode:<14}{row['ndcg@10']:>10.4f}{row['recall@100']:>10.4f}"
            f"{row['p50_ms']:>10.2f}{row['p95_ms']:>10.2f}"
        )
    print(
        json.dumps(
            {
                "dataset": args.data.resolve().name,
                "split": args.split,
                "queries": queries,
                "documents": census.documents,
                "empty_documents": census.summary(),
                "latency_k": 10,
                "quality_depth_chunks": args.depth,
                "settings": settings,
                **results,
            }
        )
    )


def _server_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The search settings in effect, when this script started the server from this env."""
    if args.url:
        return {}
    s = Settings()
    search = s.search
    return {
        "hnsw_m": s.indexing.hnsw_m,
        "hnsw_ef_construction": s.indexing.hnsw_ef_construction,
        "hnsw_ef_search": search.ef_search_by_storage(),
        "rrf_k": search.rrf_k,
        "dense_candidates": search.dense_candidates,
        "text_candidates": search.text_candidates,
        "bm25_k1": search.bm25_k1,
        "bm25_b": search.bm25_b,
        "fusion": search.fusion,
        "text_weight": search.text_weight,
        "adaptive_weight": search.adaptive_weight,
        "prf": search.prf,
        "prf_docs": search.prf_docs,
        "prf_terms": search.prf_terms,
        "prf_query_weight": search.prf_query_weight,
        "document_share": search.document_share,
        "query_encoder": s.embedding.query_encoder,
    }


if __name__ == "__main__":
    main()
