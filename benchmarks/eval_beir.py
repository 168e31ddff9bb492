"""Retrieval quality and latency of `POST /v1/search` over HTTP on a BEIR dataset.

    python benchmarks/eval_beir.py --data ../shared/data/scifact [--url URL --api-key KEY]

Without `--url` it starts `ragservice serve` on a free loopback port with its own data directory
(`--data-dir`, default `.ragservice-eval`; authentication off, loopback only) and stops it at the
end. The corpus is uploaded once through the API as an ingest job; a later run finds the
collection complete and reuses it. Then, for each mode:

- quality: every judged query with k = `--depth` chunks; documents rank by their best chunk;
  nDCG@10 and recall@100 as BEIR (pytrec_eval) defines them;
- latency: every query again with k = 10, one request at a time over a kept-alive connection;
  p50 / p95 of the client-side wall time, query embedding included.

Prints a table and a final JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Keep this folder off the import path: `benchmarks/ingest.py` would shadow the `ingest` package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import httpx  # noqa: E402

from ragservice.config import Settings  # noqa: E402
from ragservice.evaluation import (  # noqa: E402
    load_beir_queries,
    mean,
    ndcg_at_k,
    rank_documents,
    recall_at_k,
)

MODES = ("dense", "fulltext", "hybrid")
_UPLOAD_PART_BYTES = 24 * 2**20  # below the default per-file limit of 32 MiB


def main() -> None:
    args = _parse_args()
    queries = load_beir_queries(args.data, args.split)
    with (
        _server(args) as (base, headers),
        httpx.Client(base_url=base, headers=headers, timeout=600) as client,
    ):
        _ensure_corpus(client, args.collection, args.data / "corpus.jsonl")
        results = {mode: _evaluate(client, args, queries, mode) for mode in args.modes}
    _report(args, results, len(queries.texts))


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a BEIR dataset folder")
    parser.add_argument("--split", default="test")
    parser.add_argument("--url", help="a running server; default: start one")
    parser.add_argument("--api-key", default=os.environ.get("RAGSERVICE_API_KEY"))
    parser.add_argument("--data-dir", type=Path, default=Path(".ragservice-eval"))
    parser.add_argument("--collection", default=None, help="default: the dataset folder's name")
    parser.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    parser.add_argument("--depth", type=int, default=200, help="chunks fetched for quality")
    parser.add_argument("--warmup", type=int, default=20, help="untimed queries per mode")
    args = parser.parse_args()
    args.collection = args.collection or args.data.resolve().name
    return args


# -- the server ------------------------------------------------------------------------------


@contextlib.contextmanager
def _server(args: argparse.Namespace) -> Iterator[tuple[str, dict[str, str]]]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    if args.url:
        yield args.url.rstrip("/"), headers
        return
    port = _free_port()
    env = {
        **os.environ,
        "RAGSERVICE_DATA_DIR": str(args.data_dir),
        "RAGSERVICE_AUTH_DISABLED": "1",
        "HF_HUB_OFFLINE": "1",
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    env.pop("RAGSERVICE_DATABASE_URL", None)
    with tempfile.TemporaryFile(mode="w+") as log:
        server = subprocess.Popen(
            [str(Path(sys.executable).parent / "ragservice"), "serve", "--port", str(port)],
            env={**env, "RAGSERVICE_HOST": "127.0.0.1"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(base, server, log)
            yield base, headers
        finally:
            server.terminate()
            server.wait(timeout=60)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(base: str, server: subprocess.Popen[bytes], log: Any) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and server.poll() is None:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    log.seek(0)
    raise SystemExit(f"the server did not become ready:\n{log.read()[-4000:]}")


# -- the corpus ------------------------------------------------------------------------------


def _ensure_corpus(client: httpx.Client, collection: str, corpus: Path) -> None:
    expected = sum(1 for _ in corpus.open(encoding="utf-8"))
    found = client.get(f"/v1/collections/{collection}")
    if found.status_code == 404:
        _ok(client.post("/v1/collections", json={"name": collection}))
    elif _ok(found)["document_count"] == expected:
        print(f"corpus: reusing {expected} documents in {collection!r}", file=sys.stderr)
        return
    started = time.perf_counter()
    for number, part in enumerate(_parts(corpus)):
        files = [("files", (f"{corpus.stem}-{number}.jsonl", part, "application/jsonl"))]
        job = _ok(client.post(f"/v1/collections/{collection}/documents/files", files=files))
        _wait_job(client, job["id"])
    count = _ok(client.get(f"/v1/collections/{collection}"))["document_count"]
    seconds = time.perf_counter() - started
    print(f"corpus: {count} documents ingested in {seconds:.0f} s", file=sys.stderr)
    if count != expected:
        raise SystemExit(f"expected {expected} documents in {collection!r}, found {count}")


def _parts(corpus: Path) -> Iterator[bytes]:
    """The JSONL file in pieces under the upload limit, split at line ends."""
    part: list[bytes] = []
    size = 0
    with corpus.open("rb") as lines:
        for line in lines:
            if size + len(line) > _UPLOAD_PART_BYTES and part:
                yield b"".join(part)
                part, size = [], 0
            part.append(line)
            size += len(line)
    if part:
        yield b"".join(part)


def _wait_job(client: httpx.Client, job_id: str) -> None:
    last = ""
    while True:
        job = _ok(client.get(f"/v1/jobs/{job_id}"))
        progress = f"job {job_id[:8]}: {job['status']} {json.dumps(job['counts'])}"
        if progress != last:
            print(progress, file=sys.stderr)
            last = progress
        if job["status"] == "failed":
            raise SystemExit(f"ingest failed: {job['errors']}")
        if job["status"] == "done":
            if job["errors"]:
                print(f"  {len(job['errors'])} rows failed: {job['errors'][:3]}", file=sys.stderr)
            return
        time.sleep(2)


# -- evaluation ------------------------------------------------------------------------------


def _evaluate(
    client: httpx.Client, args: argparse.Namespace, queries: Any, mode: str
) -> dict[str, float]:
    texts: dict[str, str] = queries.texts
    ndcg, recall = [], []
    for query_id, text in texts.items():
        hits = _search(client, args.collection, text, mode, args.depth)["results"]
        ranked = rank_documents(hit["document"]["external_id"] for hit in hits)
        ndcg.append(ndcg_at_k(ranked, queries.qrels[query_id], 10))
        recall.append(recall_at_k(ranked, queries.qrels[query_id], 100))
    latencies = _latencies(client, args, list(texts.values()), mode)
    return {
        "ndcg@10": round(mean(ndcg), 4),
        "recall@100": round(mean(recall), 4),
        "p50_ms": round(statistics.median(latencies), 2),
        "p95_ms": round(_percentile(latencies, 0.95), 2),
    }


def _latencies(
    client: httpx.Client, args: argparse.Namespace, texts: list[str], mode: str
) -> list[float]:
    for text in texts[: args.warmup]:
        _search(client, args.collection, text, mode, 10)
    timings = []
    for text in texts:
        started = time.perf_counter()
        _search(client, args.collection, text, mode, 10)
        timings.append((time.perf_counter() - started) * 1000)
    return timings


def _search(client: httpx.Client, collection: str, query: str, mode: str, k: int) -> Any:
    body = {"query": query, "collections": [collection], "mode": mode, "k": k}
    return _ok(client.post("/v1/search", json=body))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _ok(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise SystemExit(
            f"{response.request.method} {response.request.url}: "
            f"{response.status_code} {response.text}"
        )
    return response.json()


# -- report ----------------------------------------------------------------------------------


def _report(args: argparse.Namespace, results: dict[str, dict[str, float]], queries: int) -> None:
    settings = _server_settings(args)
    print(f"{'mode':<10}{'nDCG@10':>10}{'R@100':>10}{'p50 ms':>10}{'p95 ms':>10}")
    for mode, row in results.items():
        print(
            f"{mode:<10}{row['ndcg@10']:>10.4f}{row['recall@100']:>10.4f}"
            f"{row['p50_ms']:>10.2f}{row['p95_ms']:>10.2f}"
        )
    print(
        json.dumps(
            {
                "dataset": args.data.resolve().name,
                "split": args.split,
                "queries": queries,
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
    return {
        "hnsw_m": s.hnsw_m,
        "hnsw_ef_construction": s.hnsw_ef_construction,
        "hnsw_ef_search": s.hnsw_ef_search,
        "rrf_k": s.search_rrf_k,
        "dense_candidates": s.search_dense_candidates,
        "text_candidates": s.search_text_candidates,
        "bm25_k1": s.bm25_k1,
        "bm25_b": s.bm25_b,
        "query_encoder": s.query_encoder,
    }


if __name__ == "__main__":
    main()
