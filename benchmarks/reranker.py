"""A reranker the service trains itself, measured: train-split feedback → triplets →
`ragservice finetune --reranker` → SciFact TEST nDCG@10 of hybrid without and with it.

    python benchmarks/reranker.py --data ../shared/data/scifact [--data-dir .ragservice-loop]

1. Starts `ragservice serve` on its data directory (default `.ragservice-loop`, shared with
   `feedback_loop.py`), loads the corpus once and serves the base embedding model.
2. The triplets: `DATA_DIR/loop-triplets.jsonl` when an earlier run left it (`--simulate`
   makes them again), else the simulated users of `feedback_loop.py` on the TRAIN queries,
   exported with `ragservice export-feedback --format triplets`.
3. `ragservice finetune --reranker --triplets FILE` (bounded by `--max-minutes`), timed.
4. Choices on TRAIN only: the rerank candidates (`--candidates`, e.g. 10,20,30) by nDCG@10 of
   the train questions the fine-tune held out (never trained on).
5. TEST: hybrid nDCG@10 (k = 200 chunks, documents ranked by their best chunk, as
   `eval_beir.py`) without the reranker, and with the first C chunks reranked in-process by
   the same code the server runs (`rerank_hits`), the rest left in order.
6. Latency: a server started with `RAGSERVICE_RERANKER=NAME:VERSION` answers `--latency-queries`
   test questions over HTTP (`POST /v1/query`, k = 10) with `rerank` off and on; the added
   p50 is the difference of the medians.

The test queries are never used for training or choices. Final line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any

# This folder goes last on the import path: `benchmarks/ingest.py` must not shadow `ingest`.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]

import feedback_loop as loop  # noqa: E402
from harness import connect, ensure_corpus, parse, server  # noqa: E402

from ragservice.client import RagserviceClient  # noqa: E402
from ragservice.embedding.evaluation import (  # noqa: E402
    BeirQueries,
    load_beir_queries,
    mean,
    ndcg_at_k,
    rank_documents,
)
from ragservice.embedding.finetune import split_by_anchor  # noqa: E402
from ragservice.retrieval.rerank import CrossEncoderReranker  # noqa: E402

_DEPTH = 200


def main() -> None:
    args = _parse_args()
    test = load_beir_queries(args.data, "test")
    train = load_beir_queries(args.data, "train")
    assert not set(test.texts) & set(train.texts), "train and test queries overlap"
    env = loop.environment(args)
    triplets = args.data_dir / "loop-triplets.jsonl"
    figures: dict[str, Any] = {"train_queries": len(train.texts), "test_queries": len(test.texts)}
    settings = {"RAGSERVICE_MODEL_CHECK_SECONDS": "1"}
    with server(args, settings) as (base, headers), connect(base, headers) as client:
        ensure_corpus(client, args.collection, args.data / "corpus.jsonl")
        loop._serve_base_model(client, env)
        if args.simulate or not triplets.exists():
            started = datetime.now(UTC)
            figures.update(loop._simulate_users(client, args, train))
            loop._export(env, started, triplets)
        hybrid = {
            split: _hybrid_hits(client, args.collection, queries)
            for split, queries in (("train", train), ("test", test))
        }
    figures["triplets"] = sum(1 for _ in triplets.open(encoding="utf-8"))
    trained = _train(env, args, triplets)
    figures["training_seconds"] = trained["training_seconds"]
    figures["held_out"] = trained["finetune"]["held_out"]
    ref = "{name}:{version}".format(**trained["finetune"]["reranker"])
    reranker = CrossEncoderReranker(ref, folder=trained["finetune"]["path"], device=args.device)
    reranker.warm_up()
    chosen, on_train = _choose_candidates(args, reranker, train, hybrid["train"], triplets)
    figures["choice_on_train"] = {
        "rerank_candidates": chosen,
        "ndcg@10_by_candidates": on_train,
        # Test is still measured with the best count; whether to rerank at all is train's say.
        "beats_no_reranking": on_train[str(chosen)] > on_train["0"],
    }
    figures["ndcg@10_test_hybrid"] = _ndcg(test, hybrid["test"])
    started = time.perf_counter()
    reranked = _reranked(reranker, test, hybrid["test"], chosen)
    figures["rerank_test_seconds"] = round(time.perf_counter() - started, 1)
    figures["ndcg@10_test_hybrid_reranked"] = _ndcg(test, reranked)
    extra = {"RAGSERVICE_RERANKER": ref, "RAGSERVICE_RERANK_CANDIDATES": str(chosen)}
    with server(args, extra) as (base, headers), connect(base, headers) as client:
        figures.update(_latency(client, args, test))
    figures["reranker"] = ref
    loop._report(figures)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    loop.add_loop_arguments(parser)
    parser.set_defaults(out="scifact-reranker", batch_size=16)
    parser.add_argument("--held-out", type=float, default=0.1, help="train questions held out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--simulate", action="store_true", help="simulate users again")
    parser.add_argument("--loss", default="bce", choices=("bce", "mnrl"))
    parser.add_argument("--negatives", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--max-minutes", type=float, default=10.0)
    parser.add_argument("--learning-rate", type=float, default=3e-5)
    parser.add_argument("--candidates", default="10,20,30", help="rerank candidates to try")
    parser.add_argument("--latency-queries", type=int, default=100)
    parser.add_argument("--device", default="cpu")
    return parse(parser)


# -- retrieval -------------------------------------------------------------------------------

Hit = tuple[str, str]  # (document external id, chunk text)


def _hybrid_hits(
    client: RagserviceClient, collection: str, queries: BeirQueries
) -> dict[str, list[Hit]]:
    found = {}
    for query_id, text in queries.texts.items():
        hits = client.search(text, collections=[collection], k=_DEPTH, mode="hybrid")["results"]
        found[query_id] = [(hit["document"]["external_id"], hit["text"]) for hit in hits]
    return found


def _ndcg(queries: BeirQueries, hits: dict[str, list[Hit]], ids: list[str] | None = None) -> float:
    scores = [
        ndcg_at_k(rank_documents(doc for doc, _ in hits[q]), queries.qrels[q], 10)
        for q in ids or list(queries.texts)
    ]
    return round(mean(scores), 4)


def _reranked(
    reranker: CrossEncoderReranker,
    queries: BeirQueries,
    hits: dict[str, list[Hit]],
    candidates: int,
    ids: list[str] | None = None,
) -> dict[str, list[Hit]]:
    """The first `candidates` hits of each query reordered by the reranker, the rest after."""
    out = {}
    for query_id in ids or list(queries.texts):
        head, tail = hits[query_id][:candidates], hits[query_id][candidates:]
        scores = reranker.rerank(queries.texts[query_id], [text for _, text in head])
        order = sorted(range(len(head)), key=lambda i: (-float(scores[i]), i))
        out[query_id] = [head[i] for i in order] + tail
    return out


def _choose_candidates(
    args: argparse.Namespace,
    reranker: CrossEncoderReranker,
    train: BeirQueries,
    hits: dict[str, list[Hit]],
    triplets: Path,
) -> tuple[int, dict[str, float]]:
    """The candidate count best on the train questions the fine-tune held out."""
    rows = [json.loads(line) for line in triplets.open(encoding="utf-8") if line.strip()]
    held = {t["anchor"] for t in split_by_anchor(rows, args.held_out, args.seed).held_out}
    ids = [q for q, text in train.texts.items() if text in held]
    tried = sorted(int(c) for c in args.candidates.split(","))
    # The largest count's scores hold every smaller one's: rerank once, cut per count.
    widest = _reranked(reranker, train, hits, tried[-1], ids)
    by_count = {"0": _ndcg(train, hits, ids)}
    for count in tried:
        cut = {q: _resort(widest[q], hits[q], count) for q in ids}
        by_count[str(count)] = _ndcg(train, cut, ids)
    best = max(tried, key=lambda c: (by_count[str(c)], -c))
    print(f"held-out train questions: {len(ids)}; nDCG@10 by candidates {by_count}", flush=True)
    return best, by_count


def _resort(widest: list[Hit], original: list[Hit], count: int) -> list[Hit]:
    """The reranked order of only the first `count` original hits, then the rest in order."""
    head = set(original[:count])
    return [h for h in widest if h in head] + original[count:]


# -- training and latency --------------------------------------------------------------------


def _train(env: dict[str, str], args: argparse.Namespace, triplets: Path) -> dict[str, Any]:
    command = ["finetune", "--reranker", "--triplets", str(triplets), "--out", args.out]
    command += ["--epochs", str(args.epochs), "--batch-size", str(args.batch_size)]
    command += ["--loss", args.loss, "--negatives", str(args.negatives)]
    command += ["--max-length", str(args.max_length), "--max-minutes", str(args.max_minutes)]
    command += ["--learning-rate", str(args.learning_rate), "--held-out", str(args.held_out)]
    command += ["--seed", str(args.seed)]
    if args.max_steps:
        command += ["--max-steps", str(args.max_steps)]
    started = time.perf_counter()
    done = loop._cli(env, command)
    seconds = round(time.perf_counter() - started, 1)
    return {
        "training_seconds": seconds,
        "finetune": json.loads(done.stdout.strip().splitlines()[-1]),
    }


def _latency(
    client: RagserviceClient, args: argparse.Namespace, test: BeirQueries
) -> dict[str, Any]:
    """p50 of answering with the reranker off and on (k = 10), alternating per question."""
    questions = list(test.texts.values())[: args.latency_queries]
    took: dict[bool, list[float]] = {False: [], True: []}
    for text in questions[:3]:  # warm-up
        client.answer(text, collections=[args.collection], k=10, rerank=True, cache=False)
    for text in questions:
        for rerank in (False, True):
            started = time.perf_counter()
            client.answer(text, collections=[args.collection], k=10, rerank=rerank, cache=False)
            took[rerank].append((time.perf_counter() - started) * 1000)
    off, on = median(took[False]), median(took[True])
    return {
        "p50_ms_k10_without_reranker": round(off, 1),
        "p50_ms_k10_with_reranker": round(on, 1),
        "added_p50_ms_k10": round(on - off, 1),
        "latency_queries": len(questions),
    }


if __name__ == "__main__":
    main()
