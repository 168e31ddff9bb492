"""Search on a Citus cluster against the single-node store: the same tenant and data on each,
quality, latency and load rate measured in one run.

    python benchmarks/citus.py --data ../shared/data/scifact [--queries N] [--workers 2]
        [--citus-installer ../shared/citus/install]

Starts two servers side by side (authentication off, loopback only, the default tenant on each):

- single: `ragservice serve` on the embedded single-node store (`harness.server`, its own
  `--data-dir`; default: a fresh temporary folder, removed at the end);
- cluster: a fresh Citus cluster of the embedded PostgreSQL (a coordinator and `--workers`
  workers, `ragservice.dev.citus.CitusCluster` in a temporary folder), the store migrated on the
  coordinator and distributed (`ragservice.db.distribution.distribute`) before any data is
  written, then `ragservice serve` on the coordinator as the service's login.

Citus must be installed in the embedded PostgreSQL; when it is not, `--citus-installer` (default
`../shared/citus/install` beside the repository) is run with the embedded server's `pg_config`.

The corpus is uploaded into each through the API (`harness.ensure_corpus`, the same collection
name), the cluster first; the load rate is documents over the time from the first upload to the
last job done (None when the collection was already complete). Then, for each mode (dense,
fulltext, hybrid):

- quality: every judged query with k = `--depth` documents (`group_by: "document"`), as
  `eval_beir.py` asks; nDCG@10 on each side, and the share of queries whose top 10 documents
  are the same, in the same order, on both;
- latency: every query (or the first `--queries`) with k = 10, one request at a time over a
  kept-alive connection to each server, after an untimed pass on both; single and cluster
  alternate per query (which goes first alternates too), so both see the same machine. p50 /
  p95 of the client-side wall time (query embedding included) and cluster p50 / single p50.

When the cluster side fails, the failing step, the error and the tails of the cluster server's
log and of the coordinator's PostgreSQL log are printed, and the final JSON line carries them.
Both servers are stopped and the cluster destroyed at the end, on error too.

Prints a table and a final JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

# This folder goes last on the import path: `benchmarks/ingest.py` must not shadow `ingest`.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]

from eval_beir import MODES, _search  # noqa: E402
from harness import (  # noqa: E402
    add_common_arguments,
    connect,
    corpus_census,
    ensure_corpus,
    free_port,
    parse,
    percentile,
    server,
    wait_ready,
)

from ragservice.client import RagserviceClient, SearchResponse  # noqa: E402
from ragservice.db.distribution import distribute  # noqa: E402
from ragservice.db.embedded import postgres_bin_dir  # noqa: E402
from ragservice.dev.citus import CitusCluster, citus_installed  # noqa: E402
from ragservice.embedding.evaluation import (  # noqa: E402
    load_beir_queries,
    mean,
    ndcg_at_k,
    rank_documents,
)
from ragservice.errors import NotFoundError  # noqa: E402

SIDES = ("single", "cluster")
LOG_TAIL_CHARS = 4000
T = TypeVar("T")


def main() -> None:
    args = _parse_args()
    queries = load_beir_queries(args.data, args.split)
    _ensure_citus(args.citus_installer)
    made_single_dir = args.data_dir is None
    if made_single_dir:
        args.data_dir = Path(tempfile.mkdtemp(prefix="rs-single-"))
    cluster_dir = Path(tempfile.mkdtemp(prefix="rs-citus-"))
    cluster = CitusCluster(cluster_dir, workers=args.workers)
    side = _ClusterSide(cluster, cluster_dir)
    try:
        started = time.perf_counter()
        side.step("start the cluster", cluster.start)
        side.step("migrate the store", cluster.prepare_store)
        layout = side.step("distribute the store", lambda: _distribute(cluster))
        setup_s = time.perf_counter() - started
        print(f"cluster ready and distributed in {setup_s:.1f} s: {layout}", file=sys.stderr)
        with (
            server(args) as (single_base, headers),
            side.server(headers) as cluster_base,
            connect(single_base, headers) as single,
            connect(cluster_base, headers) as on_cluster,
        ):
            clients = {"single": single, "cluster": on_cluster}
            corpus = args.data / "corpus.jsonl"
            load = {
                "cluster": side.step("load the corpus", lambda: _load(on_cluster, args, corpus)),
                "single": _load(single, args, corpus),
            }
            results = {mode: _measure(clients, side, args, queries, mode) for mode in args.modes}
    except _ClusterFailure as failure:
        _report_failure(args, failure)
        raise SystemExit(1) from None
    finally:
        side.close()
        if made_single_dir:
            shutil.rmtree(args.data_dir, ignore_errors=True)
    _report(args, results, load, layout, setup_s, len(queries.texts))


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.set_defaults(data_dir=None)  # a fresh store: the load is timed
    parser.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    parser.add_argument("--depth", type=int, default=200, help="results fetched for quality")
    parser.add_argument(
        "--queries", type=int, default=None, help="test queries to time (default: all)"
    )
    add_cluster_arguments(parser)
    return parse(parser)


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """--workers and --citus-installer (the benchmarks that start a cluster)."""
    parser.add_argument("--workers", type=int, default=2, help="Citus workers")
    parser.add_argument(
        "--citus-installer",
        type=Path,
        default=_HERE.parent.parent / "shared" / "citus" / "install",
        help="run with the embedded server's pg_config when Citus is not installed there",
    )


def _ensure_citus(installer: Path) -> None:
    """Citus in the embedded PostgreSQL, installed by `installer` when missing."""
    if citus_installed():
        return
    pg_config = postgres_bin_dir() / "pg_config"
    if not installer.is_file():
        raise SystemExit(
            f"Citus is not installed in the embedded PostgreSQL ({pg_config}) and there is no "
            f"installer at {installer}: pass --citus-installer PATH (see docs/scaling.md)"
        )
    print(f"installing Citus: {installer} {pg_config}", file=sys.stderr)
    done = subprocess.run([str(installer), str(pg_config)], capture_output=True, text=True)
    if done.returncode != 0 or not citus_installed():
        raise SystemExit(
            f"{installer} {pg_config} failed (exit {done.returncode}):\n"
            f"{(done.stdout + done.stderr)[-LOG_TAIL_CHARS:]}"
        )


# -- the cluster side ------------------------------------------------------------------------


class _ClusterFailure(Exception):
    def __init__(self, step: str, error: str, server_log: str, coordinator_log: str) -> None:
        super().__init__(f"{step}: {error}")
        self.step = step
        self.error = error
        self.server_log = server_log
        self.coordinator_log = coordinator_log


class _ClusterSide:
    """The Citus cluster, the server on it, its log, and the steps that run against it: an
    error in one (an exception, or a harness exit) becomes a `_ClusterFailure` that carries
    the server's and the coordinator's log tails."""

    def __init__(self, cluster: CitusCluster, root: Path) -> None:
        self.cluster = cluster
        self.root = root
        self.log_path = root / "server.log"

    def step(self, name: str, run: Callable[[], T]) -> T:
        try:
            return run()
        except _ClusterFailure:
            raise
        except (Exception, SystemExit) as exc:
            error = f"{type(exc).__name__}: {exc}" if isinstance(exc, Exception) else str(exc)
            raise _ClusterFailure(
                name, error, self.server_log_tail(), self.cluster.coordinator.log_tail(60)
            ) from exc

    def server_log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        except OSError:
            return ""

    @contextlib.contextmanager
    def server(self, headers: dict[str, str]) -> Iterator[str]:
        """`ragservice serve` on the coordinator, as the service's login (the owner's URL for
        migrations), its output appended to `server.log`. `harness.server` cannot be used: it
        drops RAGSERVICE_DATABASE_URL to run on the embedded store."""
        port = free_port()
        env = {
            **os.environ,
            "RAGSERVICE_DATABASE_URL": self.cluster.service_url,
            "RAGSERVICE_OWNER_DATABASE_URL": self.cluster.url,
            "RAGSERVICE_DATA_DIR": str(self.root / "service"),
            "RAGSERVICE_AUTH_DISABLED": "1",
            "RAGSERVICE_HOST": "127.0.0.1",
            "HF_HUB_OFFLINE": "1",
            "OMP_WAIT_POLICY": "PASSIVE",
        }
        base = f"http://127.0.0.1:{port}"
        with self.log_path.open("a+") as log:  # appended to; read on failure
            process = subprocess.Popen(
                [str(Path(sys.executable).parent / "ragservice"), "serve", "--port", str(port)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                self.step("start the server on the cluster", lambda: wait_ready(base, process, log))
                yield base
            finally:
                process.terminate()
                process.wait(timeout=60)

    def close(self) -> None:
        self.cluster.destroy()
        shutil.rmtree(self.root, ignore_errors=True)


def _distribute(cluster: CitusCluster) -> dict[str, Any]:
    """Distribute the migrated (empty) store; how its tables were placed and the shards of
    the distributed ones."""
    with cluster.coordinator_connection() as conn:
        report = distribute(conn)
        rows = conn.execute(
            "SELECT citus_table_type, count(*), max(shard_count) FROM citus_tables GROUP BY 1"
        ).fetchall()
    tables = {str(kind): int(count) for kind, count, _ in rows}
    shards = [int(shard_count) for kind, _, shard_count in rows if kind == "distributed"]
    return {
        "tables": tables,
        "shard_count": shards[0] if shards else None,
        "steps": len(report.steps),
    }


# -- loading ---------------------------------------------------------------------------------


def _load(client: RagserviceClient, args: argparse.Namespace, corpus: Path) -> dict[str, Any]:
    """Upload the corpus (unless the collection holds it already) and time it."""
    expected = corpus_census(corpus).documents
    try:
        reused = client.collection(args.collection)["document_count"] == expected
    except NotFoundError:
        reused = False
    started = time.perf_counter()
    census = ensure_corpus(client, args.collection, corpus)
    seconds = time.perf_counter() - started
    return {
        "documents": census.documents,
        "seconds": None if reused else round(seconds, 1),
        "docs_per_s": None if reused else round(census.documents / seconds, 2),
    }


# -- quality and latency ---------------------------------------------------------------------


def _measure(
    clients: dict[str, RagserviceClient],
    cluster_side: _ClusterSide,
    args: argparse.Namespace,
    queries: Any,
    mode: str,
) -> dict[str, Any]:
    def search(side: str, text: str, k: int) -> SearchResponse:
        if side == "single":
            return _search(clients[side], args.collection, text, mode, k, False)
        return cluster_side.step(
            f"search ({mode}, k={k})",
            lambda: _search(clients[side], args.collection, text, mode, k, False),
        )

    texts: dict[str, str] = queries.texts
    ndcg: dict[str, list[float]] = {side: [] for side in SIDES}
    same_top10 = 0
    for query_id, text in texts.items():
        top10 = {}
        for side in SIDES:
            hits = search(side, text, args.depth)
            ranked = rank_documents(hit["document"]["external_id"] for hit in hits["results"])
            ndcg[side].append(ndcg_at_k(ranked, queries.qrels[query_id], 10))
            top10[side] = ranked[:10]
        same_top10 += top10["single"] == top10["cluster"]
    timed = list(texts.values())[: args.queries]
    for text in timed:  # warm both servers and both stores' buffers
        for side in SIDES:
            search(side, text, 10)
    latencies: dict[str, list[float]] = {side: [] for side in SIDES}
    for number, text in enumerate(timed):
        for side in SIDES if number % 2 else SIDES[::-1]:
            started = time.perf_counter()
            search(side, text, 10)
            latencies[side].append((time.perf_counter() - started) * 1000)
    return {
        "ndcg10": {side: round(mean(values), 4) for side, values in ndcg.items()},
        "same_top10": round(same_top10 / len(texts), 4),
        "timed": len(timed),
        "p50_ms": {side: round(statistics.median(v), 2) for side, v in latencies.items()},
        "p95_ms": {side: round(percentile(v, 0.95), 2) for side, v in latencies.items()},
    }


# -- report ----------------------------------------------------------------------------------


def _machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cpus": os.cpu_count(), "cpu": model, "platform": platform.platform()}


def _report(
    args: argparse.Namespace,
    results: dict[str, dict[str, Any]],
    load: dict[str, dict[str, Any]],
    layout: dict[str, Any],
    setup_s: float,
    judged: int,
) -> None:
    print(
        f"{'mode':<10}{'nDCG single':>13}{'nDCG cluster':>14}{'same top10':>12}"
        f"{'p50 single':>12}{'p50 cluster':>13}{'p95 single':>12}{'p95 cluster':>13}"
        f"{'p50 ratio':>11}"
    )
    ratios = {}
    for mode, row in results.items():
        ratios[mode] = round(row["p50_ms"]["cluster"] / row["p50_ms"]["single"], 3)
        print(
            f"{mode:<10}{row['ndcg10']['single']:>13.4f}{row['ndcg10']['cluster']:>14.4f}"
            f"{row['same_top10']:>12.3f}"
            f"{row['p50_ms']['single']:>12.2f}{row['p50_ms']['cluster']:>13.2f}"
            f"{row['p95_ms']['single']:>12.2f}{row['p95_ms']['cluster']:>13.2f}"
            f"{ratios[mode]:>11.3f}"
        )
    for side in SIDES:
        rate = load[side]["docs_per_s"]
        shown = "reused" if rate is None else f"{rate:.2f} docs/s in {load[side]['seconds']} s"
        print(f"load {side:<8} {load[side]['documents']} documents: {shown}")
    print(
        json.dumps(
            {
                "dataset": args.data.resolve().name,
                "split": args.split,
                "documents": load["single"]["documents"],
                "judged_queries": judged,
                "timed_queries": next(iter(results.values()))["timed"] if results else 0,
                "quality_depth_documents": args.depth,
                "latency_k": 10,
                "ndcg10": {
                    mode: {
                        **row["ndcg10"],
                        "equal_3dp": round(row["ndcg10"]["single"], 3)
                        == round(row["ndcg10"]["cluster"], 3),
                    }
                    for mode, row in results.items()
                },
                "same_top10": {mode: row["same_top10"] for mode, row in results.items()},
                "p50_ms": {mode: row["p50_ms"] for mode, row in results.items()},
                "p95_ms": {mode: row["p95_ms"] for mode, row in results.items()},
                "p50_ratio": ratios,
                "load_docs_per_s": {side: load[side]["docs_per_s"] for side in SIDES},
                "load_seconds": {side: load[side]["seconds"] for side in SIDES},
                "workers": args.workers,
                "shard_count": layout["shard_count"],
                "citus_tables": layout["tables"],
                "cluster_setup_s": round(setup_s, 1),
                "machine": _machine(),
            }
        )
    )


def _report_failure(args: argparse.Namespace, failure: _ClusterFailure) -> None:
    print(f"cluster side failed at {failure.step!r}: {failure.error}", file=sys.stderr)
    print(f"--- cluster server log (tail) ---\n{failure.server_log}", file=sys.stderr)
    print(f"--- coordinator log (tail) ---\n{failure.coordinator_log}", file=sys.stderr)
    print(
        json.dumps(
            {
                "dataset": args.data.resolve().name,
                "workers": args.workers,
                "cluster_error": {
                    "step": failure.step,
                    "error": failure.error,
                    "server_log_tail": failure.server_log,
                    "coordinator_log_tail": failure.coordinator_log,
                },
                "machine": _machine(),
            }
        )
    )


if __name__ == "__main__":
    main()
