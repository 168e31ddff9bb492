"""What tracing costs a request: the same questions with RAGSERVICE_TRACING off and on.

    python benchmarks/tracing.py --data ../shared/data/scifact [--documents 200] [--rounds 6]

Starts two `ragservice serve` processes on one data directory (`--data-dir`, default
`.ragservice-eval`): one with tracing off, one with it on and `OTEL_TRACES_EXPORTER=none`, so
every span (request, stages, SQL) is made, sampled and ended but none leaves the process: the
SDK's cost without the network. The prompt cache is off on both. The first `--documents`
documents of the corpus are loaded once, through the API. Then rounds, the servers' order
alternating: each round asks each server the same `--per-round` questions one at a time, by
turns `POST /v1/search` and `POST /v1/query` (an extractive answer: no inference server). Reports
each round's client-side p50 per server, the medians over the rounds and their ratio (on / off);
prints a final JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# This folder goes last on the import path: `benchmarks/ingest.py` must not shadow `ingest`.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]

import httpx  # noqa: E402
from harness import add_common_arguments, ensure_corpus, ok, parse, percentile, server  # noqa: E402

from ragservice.embedding.evaluation import load_beir_queries  # noqa: E402

COMMON_ENV = {"RAGSERVICE_CACHE_ENABLED": "0"}
SERVERS = {
    "off": COMMON_ENV,
    "on": {**COMMON_ENV, "RAGSERVICE_TRACING": "1", "OTEL_TRACES_EXPORTER": "none"},
}


def main() -> None:
    args = _parse_args()
    if args.url:
        raise SystemExit("tracing.py starts its own two servers; --url is not supported")
    questions = list(load_beir_queries(args.data, args.split).texts.values())[: args.per_round]
    with contextlib.ExitStack() as stack:
        clients = {
            name: stack.enter_context(_client(stack, args, env)) for name, env in SERVERS.items()
        }
        with tempfile.TemporaryDirectory() as folder:
            corpus = _first_documents(args.data / "corpus.jsonl", args.documents, Path(folder))
            ensure_corpus(clients["off"], args.collection, corpus)
        for client in clients.values():  # warm both: model, connections, plans
            _round(client, args, questions[: args.warmup])
        p50s: dict[str, list[float]] = {name: [] for name in SERVERS}
        for number in range(args.rounds):
            order = list(SERVERS) if number % 2 == 0 else list(reversed(SERVERS))
            for name in order:
                p50s[name].append(percentile(_round(clients[name], args, questions), 0.5))
    _report(args, p50s, len(questions))


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--documents", type=int, default=200, help="corpus documents loaded")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--per-round", type=int, default=60, help="requests per server a round")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--k", type=int, default=5)
    args = parse(parser)
    args.collection = f"{args.collection}-{args.documents}"
    return args


@contextlib.contextmanager
def _client(stack: contextlib.ExitStack, args: argparse.Namespace, env: dict[str, str]) -> Any:
    base, headers = stack.enter_context(server(args, env))
    with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
        yield client


def _first_documents(corpus: Path, count: int, folder: Path) -> Path:
    small = folder / "corpus.jsonl"
    with corpus.open("rb") as source, small.open("wb") as target:
        target.writelines(itertools.islice(source, count))
    return small


def _round(client: httpx.Client, args: argparse.Namespace, questions: list[str]) -> list[float]:
    """Milliseconds per request, the questions asked by turns through search and query."""
    latencies = []
    for number, question in enumerate(questions):
        path = "/v1/search" if number % 2 == 0 else "/v1/query"
        key = "query" if path == "/v1/search" else "question"
        body = {key: question, "collections": [args.collection], "k": args.k}
        started = time.perf_counter()
        ok(client.post(path, json=body))
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def _report(args: argparse.Namespace, p50s: dict[str, list[float]], per_round: int) -> None:
    medians = {name: statistics.median(values) for name, values in p50s.items()}
    ratio = medians["on"] / medians["off"]
    print(f"{'round':>5} {'off p50 ms':>11} {'on p50 ms':>10}")
    for number, (off, on) in enumerate(zip(p50s["off"], p50s["on"], strict=True), 1):
        print(f"{number:>5} {off:>11.2f} {on:>10.2f}")
    print(f"median p50: off {medians['off']:.2f} ms, on {medians['on']:.2f} ms, ratio {ratio:.3f}")
    print(
        json.dumps(
            {
                "benchmark": "tracing",
                "documents": args.documents,
                "rounds": args.rounds,
                "requests_per_round": per_round,
                "p50_ms_off": round(medians["off"], 3),
                "p50_ms_on": round(medians["on"], 3),
                "ratio_on_off": round(ratio, 4),
                "p50_ms_per_round": {k: [round(v, 3) for v in vs] for k, vs in p50s.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
