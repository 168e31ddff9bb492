"""The feedback loop, measured: simulated users' feedback → triplets → a fine-tuned embedding
model → the corpus re-embedded beside the old one → activated → better retrieval?

    python benchmarks/feedback_loop.py --data ../shared/data/scifact [--data-dir .ragservice-loop]

1. Starts `ragservice serve` on its own data directory (default `.ragservice-loop`, so the
   retrieval benchmarks' `.ragservice-eval` keeps its model) and loads the corpus (once).
   A model left active by an earlier run is switched back to the base model first.
2. Evaluates the test queries (dense and hybrid, nDCG@10 over documents ranked by their best
   chunk, as `eval_beir.py`): *before*.
3. Simulates users with the TRAIN queries only: each is asked through `POST /v1/query`; the
   answer gets feedback from the train judgments: every chunk of a relevant document marked
   relevant, the shown chunks of non-relevant documents (the top `--irrelevant-top` sources)
   marked irrelevant, and a thumbs-up when a relevant document was among the sources.
4. `ragservice export-feedback --format triplets` (this run's feedback), `ragservice finetune
   --triplets` (that file), `ragservice reembed`, `ragservice models activate`: the CLI
   commands, as an operator would run them, timed.
5. Waits until the server serves the new model, and evaluates the test queries again: *after*.

The test queries are never used for training. Prints a table and a final JSON line with
`ndcg@10_before` and `ndcg@10_after` per mode, the training and re-embedding times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

# This folder goes last on the import path: `benchmarks/ingest.py` must not shadow `ingest`.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]

from harness import add_common_arguments, connect, ensure_corpus, parse, server  # noqa: E402

from ragservice.client import Mode, RagserviceClient  # noqa: E402
from ragservice.config import DEFAULT_EMBEDDING_MODEL  # noqa: E402
from ragservice.embedding.evaluation import (  # noqa: E402
    BeirQueries,
    load_beir_queries,
    mean,
    ndcg_at_k,
    rank_documents,
)
from ragservice.errors import NotFoundError  # noqa: E402

MODES = ("dense", "hybrid")
RAGSERVICE = str(Path(sys.executable).parent / "ragservice")


def main() -> None:
    args = _parse_args()
    test = load_beir_queries(args.data, "test")
    train = load_beir_queries(args.data, "train")
    assert not set(test.texts) & set(train.texts), "train and test queries overlap"
    figures: dict[str, Any] = {"train_queries": len(train.texts), "test_queries": len(test.texts)}
    env = environment(args)
    with server(args, {"RAGSERVICE_MODEL_CHECK_SECONDS": "1"}) as (base, headers):
        with connect(base, headers) as client:
            ensure_corpus(client, args.collection, args.data / "corpus.jsonl")
            _serve_base_model(client, env)
            before = {mode: _evaluate(client, args.collection, test, mode) for mode in MODES}
            started = datetime.now(UTC)
            figures.update(_simulate_users(client, args, train))
        triplets = args.data_dir / "loop-triplets.jsonl"
        figures["triplets"] = _export(env, started, triplets)
        figures.update(_finetune(env, args, triplets))
        figures["reembed_seconds"] = _timed_cli(env, ["reembed", "--model", args.out])
        _timed_cli(env, ["models", "activate", args.out])
        with connect(base, headers) as client:
            figures["switch_seconds"] = _wait_for_model(client, args.out)
            after = {mode: _evaluate(client, args.collection, test, mode) for mode in MODES}
    for mode in MODES:
        figures[f"ndcg@10_before_{mode}"] = before[mode]
        figures[f"ndcg@10_after_{mode}"] = after[mode]
        figures[f"gain_points_{mode}"] = round((after[mode] - before[mode]) * 100, 2)
    _report(figures)


def environment(args: argparse.Namespace) -> dict[str, str]:
    """The CLI commands' environment: this run's data directory, its embedded database."""
    env = {**os.environ, "RAGSERVICE_DATA_DIR": str(args.data_dir), "HF_HUB_OFFLINE": "1"}
    env.pop("RAGSERVICE_DATABASE_URL", None)
    return env


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_loop_arguments(parser)
    return parse(parser)


def add_loop_arguments(parser: argparse.ArgumentParser) -> None:
    """The simulation's and training's arguments (`reranker.py` shares them)."""
    add_common_arguments(parser)
    parser.set_defaults(data_dir=Path(".ragservice-loop"))
    parser.add_argument("--out", default="scifact-feedback", help="the fine-tuned model's name")
    parser.add_argument("--k", type=int, default=10, help="chunks retrieved per simulated question")
    parser.add_argument("--irrelevant-top", type=int, default=5)
    parser.add_argument("--depth", type=int, default=200, help="chunks fetched for evaluation")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-steps", type=int, default=None)


# -- the model being served ------------------------------------------------------------------


def _serving_model(client: RagserviceClient) -> dict[str, Any]:
    return client.health()["model"]


def _serve_base_model(client: RagserviceClient, env: dict[str, str]) -> None:
    """An earlier run's model may still be active: start from the base model."""
    if _serving_model(client)["name"] != DEFAULT_EMBEDDING_MODEL:
        _timed_cli(env, ["models", "activate", DEFAULT_EMBEDDING_MODEL])
        _wait_for_model(client, DEFAULT_EMBEDDING_MODEL)


def _wait_for_model(client: RagserviceClient, name: str) -> float:
    started = time.perf_counter()
    while _serving_model(client)["name"] != name:
        if time.perf_counter() - started > 600:
            raise SystemExit(f"the server did not switch to {name!r}")
        time.sleep(0.5)
    return round(time.perf_counter() - started, 1)


# -- evaluation ------------------------------------------------------------------------------


def _evaluate(client: RagserviceClient, collection: str, queries: BeirQueries, mode: str) -> float:
    scores = []
    for query_id, text in queries.texts.items():
        found = client.search(text, collections=[collection], k=200, mode=cast(Mode, mode))
        hits = found["results"]
        ranked = rank_documents(hit["document"]["external_id"] for hit in hits)
        scores.append(ndcg_at_k(ranked, queries.qrels[query_id], 10))
    return round(mean(scores), 4)


# -- simulated users -------------------------------------------------------------------------


def _simulate_users(
    client: RagserviceClient, args: argparse.Namespace, train: BeirQueries
) -> dict[str, Any]:
    chunks: dict[str, list[str]] = {}

    def chunk_ids(external_id: str) -> list[str]:
        if external_id not in chunks:
            try:
                document = client.document(args.collection, external_id)
            except NotFoundError:  # a document with no text is not stored
                chunks[external_id] = []
            else:
                chunks[external_id] = [c["id"] for c in document["chunks"] or []]
        return chunks[external_id]

    started = time.perf_counter()
    counts = {"feedback": 0, "thumbs_up": 0, "relevant_marked": 0, "irrelevant_marked": 0}
    for query_id, text in train.texts.items():
        answer = client.answer(text, collections=[args.collection], k=args.k, cache=False)
        relevant_docs = {doc for doc, grade in train.qrels[query_id].items() if grade > 0}
        relevant = [c for doc in sorted(relevant_docs) for c in chunk_ids(doc)]
        shown = answer["sources"][: args.irrelevant_top]
        irrelevant = [
            c
            for source in shown
            if source["document"]["external_id"] not in relevant_docs
            for c in source["chunk_ids"]
        ]
        found = any(s["document"]["external_id"] in relevant_docs for s in answer["sources"])
        given = client.feedback(
            answer["query_id"],
            rating=1 if found else -1,
            relevant_chunk_ids=relevant,
            irrelevant_chunk_ids=[c for c in irrelevant if c not in relevant],
        )
        counts["feedback"] += 1
        counts["thumbs_up"] += found
        counts["relevant_marked"] += len(given["relevant_chunk_ids"])
        counts["irrelevant_marked"] += len(given["irrelevant_chunk_ids"])
    counts["simulation_seconds"] = round(time.perf_counter() - started, 1)
    return counts


# -- the operator's commands -----------------------------------------------------------------


def _cli(env: dict[str, str], args: list[str]) -> subprocess.CompletedProcess[str]:
    """Runs a command; its progress (stderr) shows as it goes, its stdout is returned."""
    print(f"$ ragservice {' '.join(args)}", file=sys.stderr, flush=True)
    done = subprocess.run(
        [RAGSERVICE, *args], env=env, stdout=subprocess.PIPE, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"ragservice {' '.join(args)} failed (exit {done.returncode})")
    return done


def _timed_cli(env: dict[str, str], args: list[str]) -> float:
    started = time.perf_counter()
    _cli(env, args)
    return round(time.perf_counter() - started, 1)


def _export(env: dict[str, str], since: datetime, path: Path) -> int:
    _cli(
        env,
        [
            "export-feedback",
            "--format",
            "triplets",
            "--since",
            since.isoformat(),
            "--output",
            str(path),
        ],
    )
    with path.open(encoding="utf-8") as lines:
        return sum(1 for _ in lines)


def _finetune(env: dict[str, str], args: argparse.Namespace, triplets: Path) -> dict[str, Any]:
    command = ["finetune", "--triplets", str(triplets), "--out", args.out]
    command += ["--epochs", str(args.epochs), "--batch-size", str(args.batch_size)]
    if args.max_steps:
        command += ["--max-steps", str(args.max_steps)]
    started = time.perf_counter()
    done = _cli(env, command)
    seconds = round(time.perf_counter() - started, 1)
    last = done.stdout.strip().splitlines()[-1]
    return {"training_seconds": seconds, "finetune": json.loads(last)}


def _report(figures: dict[str, Any]) -> None:
    for key, value in figures.items():
        print(f"{key:<28} {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
