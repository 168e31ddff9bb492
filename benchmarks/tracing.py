"""What tracing costs a request: the same questions with RAGSERVICE_TRACING off and on.

    python benchmarks/tracing.py --data ../shared/data/scifact [--documents 200] [--rounds 6]

Starts two `ragservice serve` processes on one data directory (`--data-dir`, default
`.ragservice-eval`): one with tracing off, one with it on and `OTEL_TRACES_EXPORTER=none`, so
every span (request, stages, SQL) is made, sampled and ended but none leaves the process: the
SDK's cost without the network. The prompt cache is off on both. The first `--documents`
documents of the corpus are loaded once, through the API. Then rounds, the servers' order
alternating: each round asks each server the same `--per-round` questions one at a time, by
turns `POST /v1/search` and `POST /v1/query` (an extractive answer: no inference server). Reports
each round's client-side p50 per server, the medians over the rounds and their ratio (on / off).

What tracing *off* costs is too small for two servers to show, so it is measured directly: the
off path adds one check of a module-level name to each stage (`timing.timed`) and one to each
request (the middleware's `tracing.current()`); the benchmark times `timed` against the same
block without the check (a million times each, best of five) and reports the added nanoseconds
per request (the stage count of a question times the check, plus the request's own) and that
as a share of the off server's p50. Prints a final JSON line.
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
import timeit
from collections.abc import Callable, Iterator
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

from ragservice import timing  # noqa: E402
from ragservice.client import RagserviceClient  # noqa: E402
from ragservice.embedding.evaluation import load_beir_queries  # noqa: E402
from ragservice.observability import tracing  # noqa: E402

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
    with connect(base, headers, timeout=120) as client:
        yield client


def _first_documents(corpus: Path, count: int, folder: Path) -> Path:
    small = folder / "corpus.jsonl"
    with corpus.open("rb") as source, small.open("wb") as target:
        target.writelines(itertools.islice(source, count))
    return small


def _round(client: RagserviceClient, args: argparse.Namespace, questions: list[str]) -> list[float]:
    """Milliseconds per request, the questions asked by turns through search and query."""
    latencies = []
    collections = [args.collection]
    for number, question in enumerate(questions):
        started = time.perf_counter()
        if number % 2 == 0:
            client.search(question, collections=collections, k=args.k)
        else:
            client.answer(question, collections=collections, k=args.k, cache=False)
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


# The stages a question's answer goes through with the cache on (cache_lookup, embed,
# fulltext, fuse, rerank, context, generate, log_write), rounded up.
STAGES_PER_REQUEST = 10


@contextlib.contextmanager
def _timed_without_check(timings: dict[str, float], name: str) -> Iterator[None]:
    """`timing.timed` as it was before tracing: no span check."""
    started = time.perf_counter()
    try:
        yield
    finally:
        timing.add_ms(timings, name, timing.ms_since(started))


def _best_ns(block: Callable[[], None], repeats: int = 5, number: int = 1_000_000) -> float:
    return min(timeit.repeat(block, repeat=repeats, number=number)) / number * 1e9


def _off_path_ns() -> dict[str, float]:
    """Nanoseconds the tracing-off path adds: per stage (`timed`'s check) and per request."""
    assert tracing.current() is None  # this process never turns tracing on
    timings: dict[str, float] = {}

    def checked() -> None:
        with timing.timed(timings, "stage"):
            pass

    def unchecked() -> None:
        with _timed_without_check(timings, "stage"):
            pass

    per_stage = max(_best_ns(checked) - _best_ns(unchecked), 0.0)
    per_request = _best_ns(tracing.current)
    return {
        "per_stage": per_stage,
        "per_request_check": per_request,
        "per_request": per_stage * STAGES_PER_REQUEST + per_request,
    }


def _report(args: argparse.Namespace, p50s: dict[str, list[float]], per_round: int) -> None:
    medians = {name: statistics.median(values) for name, values in p50s.items()}
    ratio = medians["on"] / medians["off"]
    off_ns = _off_path_ns()
    off_share = off_ns["per_request"] / (medians["off"] * 1e6)
    print(f"{'round':>5} {'off p50 ms':>11} {'on p50 ms':>10}")
    for number, (off, on) in enumerate(zip(p50s["off"], p50s["on"], strict=True), 1):
        print(f"{number:>5} {off:>11.2f} {on:>10.2f}")
    print(f"median p50: off {medians['off']:.2f} ms, on {medians['on']:.2f} ms, ratio {ratio:.3f}")
    print(
        f"tracing off adds {off_ns['per_stage']:.1f} ns a stage, "
        f"{off_ns['per_request']:.0f} ns a request: {off_share:.2e} of the off p50"
    )
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
                "off_path_ns_per_stage": round(off_ns["per_stage"], 1),
                "off_path_ns_per_request": round(off_ns["per_request"], 1),
                "off_path_share_of_p50": float(f"{off_share:.3g}"),
                "p50_ms_per_round": {k: [round(v, 3) for v in vs] for k, vs in p50s.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
