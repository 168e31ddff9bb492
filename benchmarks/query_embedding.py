"""Latency of embedding one query: sentence-transformers `encode`, a lean torch path, ONNX Runtime.

    python benchmarks/query_embedding.py --data ../shared/data/scifact [--repeats 3]
        [--onnx-threads 1 2] [--device cpu]

Reads the queries of a BEIR folder (`queries.jsonl`, kept to those in `qrels/test.tsv` when that
file exists: SciFact's 300 test claims) or any JSONL/text file of queries, one per line. Every
query is embedded by each path in turn, in a rotating order, so that a machine that slows down
during the run slows all paths alike. Prints a table and a final JSON line; `max_abs_diff` is the
largest difference from `encode`'s vector over all queries.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import numpy.typing as npt

from ragservice.config import Settings
from ragservice.embedding import query_encoder as qe
from ragservice.embedding.embedder import SentenceTransformerEmbedder, make_embedder

Encode = Callable[[str], npt.NDArray[np.float32]]
WARM_UP = 20


def main() -> None:
    args = _parse_args()
    queries = load_queries(args.data)[: args.limit]
    with tempfile.TemporaryDirectory(prefix="rs-bench-") as tmp:
        settings = Settings(data_dir=Path(tmp), device=args.device, query_encoder="onnx")
        embedder = make_embedder(settings)
        started = time.perf_counter()
        embedder.warm_up()
        warm_up_s = time.perf_counter() - started
        paths = _paths(embedder, Path(tmp) / "onnx", args.onnx_threads)
        figures = measure(paths, queries, args.repeats)
    summary: dict[str, object] = {
        "queries": len(queries),
        "repeats": args.repeats,
        "device": embedder.device,
        "service_query_backend": embedder.query_backend,
        "warm_up_s_with_export": round(warm_up_s, 2),
        "torch_threads": _torch_threads(),
        **{f"{path}_{key}": value for path, row in figures.items() for key, value in row.items()},
    }
    _print(figures, summary)


def load_queries(data: Path) -> list[str]:
    """BEIR queries (the test split's when `qrels/test.tsv` lies beside them), or text lines."""
    if data.is_dir():
        data = data / "queries.jsonl"
    if data.suffix != ".jsonl":
        return [line for line in data.read_text().splitlines() if line.strip()]
    qrels = data.parent / "qrels" / "test.tsv"
    wanted = _qrels_ids(qrels) if qrels.exists() else None
    return [text for id_, text in _jsonl(data) if wanted is None or id_ in wanted]


def _jsonl(path: Path) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(str(row["_id"]), str(row["text"])) for row in rows]


def _qrels_ids(path: Path) -> set[str]:
    lines = path.read_text().splitlines()[1:]  # a header line: query-id, corpus-id, score
    return {line.split("\t")[0] for line in lines if line.strip()}


def _paths(
    embedder: SentenceTransformerEmbedder, cache_dir: Path, onnx_threads: list[int]
) -> dict[str, Encode]:
    model = embedder.model
    pipeline = qe.QueryPipeline(model)

    def st_encode(text: str) -> npt.NDArray[np.float32]:
        vectors = model.encode([text], normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(vectors[0], dtype=np.float32)

    paths: dict[str, Encode] = {
        "st_encode": st_encode,
        "torch": qe.TorchQueryEncoder(pipeline).encode,
    }
    # ONNX Runtime runs on CPU here; a CUDA model is measured on its torch paths only.
    for threads in onnx_threads if pipeline.device.type == "cpu" else []:
        # Reuses the file warm_up exported into the same cache folder.
        encoder = qe.load_onnx_encoder(
            pipeline,
            name=embedder.name,
            model_dir=Path(embedder.path),
            cache_dir=cache_dir,
            threads=threads,
        )
        paths[f"onnx_{threads}t"] = encoder.encode
    paths["service_embed_query"] = embedder.embed_query
    return paths


def measure(
    paths: dict[str, Encode], queries: list[str], repeats: int
) -> dict[str, dict[str, float]]:
    names = list(paths)
    reference = {q: paths["st_encode"](q) for q in queries}
    for name in names:  # first calls allocate and initialise: not part of a query's cost
        for text in queries[:WARM_UP]:
            paths[name](text)
    times: dict[str, list[float]] = {name: [] for name in names}
    diffs: dict[str, float] = dict.fromkeys(names, 0.0)
    for round_ in range(repeats):
        for i, text in enumerate(queries):
            shift = (i + round_) % len(names)
            for name in names[shift:] + names[:shift]:
                started = time.perf_counter()
                vector = paths[name](text)
                times[name].append((time.perf_counter() - started) * 1000)
                diffs[name] = max(diffs[name], float(np.abs(vector - reference[text]).max()))
    return {name: _row(times[name], diffs[name]) for name in names}


def _row(ms: list[float], diff: float) -> dict[str, float]:
    ordered = sorted(ms)
    return {
        "p50_ms": round(statistics.median(ordered), 2),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
        "mean_ms": round(statistics.fmean(ordered), 2),
        "max_abs_diff": float(f"{diff:.2e}"),
    }


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def _print(figures: dict[str, dict[str, float]], summary: dict[str, object]) -> None:
    base = figures["st_encode"]["p50_ms"]
    print(f"{'path':<22}{'p50 ms':>9}{'p95 ms':>9}{'mean ms':>9}{'vs encode':>11}{'max diff':>11}")
    for name, row in figures.items():
        speedup = base / row["p50_ms"]
        print(
            f"{name:<22}{row['p50_ms']:>9.2f}{row['p95_ms']:>9.2f}{row['mean_ms']:>9.2f}"
            f"{speedup:>10.2f}x{row['max_abs_diff']:>11.1e}"
        )
    print(json.dumps(summary))


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data", type=Path, required=True, help="BEIR folder, queries.jsonl or a text file"
    )
    parser.add_argument("--limit", type=int, default=None, help="only the first N queries")
    parser.add_argument("--repeats", type=int, default=3, help="passes over the queries")
    parser.add_argument(
        "--onnx-threads",
        type=int,
        nargs="+",
        default=[qe.default_threads()],
        help="ONNX Runtime intra-op threads to compare (default: what the service uses)",
    )
    parser.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    return parser.parse_args()


if __name__ == "__main__":
    main()
