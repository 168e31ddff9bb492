"""Latency and throughput of `POST /v1/query` over HTTP, at several concurrency levels.

    python benchmarks/query.py --data ../shared/data/scifact [--concurrency 1,8] [--url URL]

Uses the same server and corpus set-up as `eval_beir.py` (a `ragservice serve` it starts on
loopback with `--data-dir`, default `.ragservice-eval`, and the corpus uploaded once through the
API). Sends every judged test question to `/v1/query` (no inference layer unless the server has
one configured: the answer is then extractive) with N clients at once, each on its own
kept-alive connection, with the prompt cache off unless `--cache` (the same questions are asked
at every concurrency level); reports client-side p50 / p95 latency, queries per second over the
whole run, and the medians of the per-stage timings the service returns. Prints a table and a
final JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# This folder goes last on the import path: `benchmarks/ingest.py` must not shadow `ingest`.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]

from harness import (  # noqa: E402
    add_common_arguments,
    connect,
    ensure_corpus,
    parse,
    percentile,
    server,
)

from ragservice.client import QueryResponse, RagserviceClient  # noqa: E402
from ragservice.embedding.evaluation import load_beir_queries  # noqa: E402


def main() -> None:
    args = _parse_args()
    questions = list(load_beir_queries(args.data, args.split).texts.values())
    with server(args) as (base, headers):
        with connect(base, headers) as client:
            ensure_corpus(client, args.collection, args.data / "corpus.jsonl")
            for question in questions[: args.warmup]:
                _ask(client, args, question)
        results = {c: _run(base, headers, args, questions, c) for c in args.concurrency}
    _report(args, results, len(questions))


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8]
    )
    parser.add_argument("--k", type=int, default=8, help="chunks retrieved per question")
    parser.add_argument("--warmup", type=int, default=20, help="untimed questions first")
    parser.add_argument(
        "--cache", action="store_true", help="let the prompt cache answer repeats (default: off)"
    )
    return parse(parser)


def _run(
    base: str, headers: dict[str, str], args: argparse.Namespace, questions: list[str], n: int
) -> dict[str, Any]:
    def worker(share: list[str]) -> list[tuple[float, dict[str, float]]]:
        with connect(base, headers) as client:
            return [_timed(client, args, question) for question in share]

    shares = [questions[i::n] for i in range(n)]
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=n) as pool:
        measured = [row for rows in pool.map(worker, shares) for row in rows]
    seconds = time.perf_counter() - started
    latencies = [ms for ms, _ in measured]
    return {
        "p50_ms": round(statistics.median(latencies), 2),
        "p95_ms": round(percentile(latencies, 0.95), 2),
        "qps": round(len(measured) / seconds, 2),
        "stages_p50_ms": _stage_medians([timings for _, timings in measured]),
    }


def _timed(
    client: RagserviceClient, args: argparse.Namespace, question: str
) -> tuple[float, dict[str, float]]:
    started = time.perf_counter()
    answer = _ask(client, args, question)
    return (time.perf_counter() - started) * 1000, answer["timings_ms"]


def _ask(client: RagserviceClient, args: argparse.Namespace, question: str) -> QueryResponse:
    # Cache off: every question takes the whole path, however often asked.
    return client.answer(question, collections=[args.collection], k=args.k, cache=args.cache)


def _stage_medians(rows: list[dict[str, float]]) -> dict[str, float]:
    stages = sorted({stage for row in rows for stage in row})
    return {s: round(statistics.median(r.get(s, 0.0) for r in rows), 2) for s in stages}


def _report(args: argparse.Namespace, results: dict[int, dict[str, Any]], questions: int) -> None:
    print(f"{'clients':<10}{'p50 ms':>10}{'p95 ms':>10}{'qps':>10}  stages p50 ms")
    for n, row in results.items():
        stages = " ".join(f"{k}={v}" for k, v in row["stages_p50_ms"].items())
        print(f"{n:<10}{row['p50_ms']:>10.2f}{row['p95_ms']:>10.2f}{row['qps']:>10.2f}  {stages}")
    summary = {
        "dataset": args.data.resolve().name,
        "questions": questions,
        "k": args.k,
        "concurrency": {str(n): row for n, row in results.items()},
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
