"""Read replicas on one machine: search through a replica vs the primary, the cost of a
consistency-token wait, and failover when a replica stops.

    python benchmarks/replicas.py --data ../shared/data/scifact [--data-dir .ragservice-eval]

Loads the corpus as `eval_beir.py` does (reusing it when present), then makes two streaming
standbys (`eu-1`, `us-1`) of the embedded primary with the code of `ragservice dev-cluster`, and
starts two servers on the same primary: one with no replicas, one in region `eu` with both
replicas (default check interval and lag bound). Then:

- search: every test query, k = 10, hybrid, sent to both servers in turn (after an untimed pass
  to warm each node's buffers); p50 / p95 of the client-side wall time, and the ratio; the
  replica's health and lag as the server saw them meanwhile (its readiness, polled);
- token wait: a write (PATCH of a collection) then at once a read of it, with the write's
  consistency token and without; then reads with an old token (the replica known current to
  the health check) against reads without one;
- failover: one client reads in a loop while `eu-1` is stopped (`pg_ctl -m fast`) and started
  again: the time from the stop to the first read served elsewhere, errors seen, and the time
  from the start until `eu-1` serves again.

The standbys are removed at the end (their replication slots too). Prints a table and a final
JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# This folder goes last on the import path: `benchmarks/ingest.py` must not shadow `ingest`.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]

import httpx  # noqa: E402
from harness import add_common_arguments, ensure_corpus, ok, parse, percentile, server  # noqa: E402

from ragservice.client import RagserviceClient  # noqa: E402
from ragservice.dev.cluster import DevCluster  # noqa: E402
from ragservice.embedding.evaluation import load_beir_queries  # noqa: E402

TOKEN = "X-Consistency-Token"
NODE = "X-Read-Node"


def main() -> None:
    args = _parse_args()
    queries = list(load_beir_queries(args.data, args.split).texts.values())[: args.queries]
    with server(args) as (base, headers), _client(base, headers) as client:
        # The same connection; the timed requests below stay raw httpx: they read the node
        # that served them and the consistency token from the response headers.
        ensure_corpus(RagserviceClient(client), args.collection, args.data / "corpus.jsonl")
    cluster = DevCluster(args.data_dir, replicas=2, regions=("eu", "us"))
    started = time.perf_counter()
    cluster.start()
    print(f"standbys ready in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    replicated = {"RAGSERVICE_REGION": "eu", "RAGSERVICE_REPLICAS": cluster.replicas_setting()}
    try:
        with (
            server(args) as (primary_base, headers),
            server(args, replicated) as (replica_base, _),
            _client(primary_base, headers) as primary,
            _client(replica_base, headers) as replica,
        ):
            with _Monitor(_client(replica_base, headers)) as monitor:
                search = _search(primary, replica, args.collection, queries)
            results = {
                "search": {**search, "eu1_while_timed": monitor.summary("eu-1")},
                "token": _token_wait(replica, args.rounds),
                "failover": _failover(replica, cluster),
            }
    finally:
        cluster.destroy()
    _report(results)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--queries", type=int, default=300, help="test queries to time")
    parser.add_argument("--rounds", type=int, default=200, help="write-then-read rounds")
    return parse(parser)


def _client(base: str, headers: dict[str, str]) -> httpx.Client:
    return httpx.Client(base_url=base, headers=headers, timeout=60)


# -- search ----------------------------------------------------------------------------------


def _search(
    primary: httpx.Client, replica: httpx.Client, collection: str, queries: list[str]
) -> dict[str, Any]:
    def timed(client: httpx.Client, query: str) -> tuple[float, str]:
        body = {"query": query, "collections": [collection], "k": 10, "mode": "hybrid"}
        started = time.perf_counter()
        response = client.post("/v1/search", json=body)
        ms = (time.perf_counter() - started) * 1000
        ok(response)
        return ms, response.headers.get(NODE, "?")

    for query in queries:  # warm both nodes' buffers and both servers
        timed(primary, query)
        timed(replica, query)
    through: dict[str, list[float]] = {"primary": [], "replica": []}
    by_node: dict[str, list[float]] = {}
    for i, query in enumerate(queries):
        order = [("primary", primary), ("replica", replica)]
        for name, client in order if i % 2 else order[::-1]:
            ms, node = timed(client, query)
            through[name].append(ms)
            if name == "replica":
                by_node.setdefault(node, []).append(ms)
    p50 = {name: statistics.median(values) for name, values in through.items()}
    replica_only = by_node.get("eu-1", [])
    return {
        "queries": len(queries),
        "primary_p50_ms": round(p50["primary"], 2),
        "primary_p95_ms": round(percentile(through["primary"], 0.95), 2),
        "replica_server_p50_ms": round(p50["replica"], 2),
        "replica_server_p95_ms": round(percentile(through["replica"], 0.95), 2),
        "served_by": {node: len(values) for node, values in by_node.items()},
        "served_by_eu1_p50_ms": round(statistics.median(replica_only), 2) if replica_only else None,
        "replica_server_over_primary": round(p50["replica"] / p50["primary"], 3),
    }


class _Monitor:
    """Polls the server's readiness (the replica checks it reports) on its own thread."""

    def __init__(self, client: httpx.Client, interval: float = 0.25) -> None:
        self.client = client
        self.interval = interval
        self.samples: list[dict[str, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> _Monitor:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.client.close()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            nodes = ok(self.client.get("/v1/admin/health")).get("nodes", [])
            self.samples.append({node["name"]: node for node in nodes})

    def summary(self, name: str) -> dict[str, Any]:
        states = [sample[name] for sample in self.samples if name in sample]
        lags = [s["lag_seconds"] for s in states if s["lag_seconds"] is not None]
        reasons = sorted({s["error"] or "lag over the bound" for s in states if not s["serving"]})
        return {
            "samples": len(states),
            "serving_share": round(sum(s["serving"] for s in states) / max(len(states), 1), 3),
            "lag_p50_s": round(statistics.median(lags), 3) if lags else None,
            "lag_max_s": max(lags) if lags else None,
            "lag_bytes_max": max((s["lag_bytes"] or 0 for s in states), default=None),
            "not_serving_because": reasons,
        }


# -- the consistency token -------------------------------------------------------------------


def _token_wait(client: httpx.Client, rounds: int) -> dict[str, Any]:
    name = "bench-token"
    if client.get(f"/v1/collections/{name}").status_code == 404:
        ok(client.post("/v1/collections", json={"name": name}))
    path = f"/v1/collections/{name}"
    kinds = ("with_token", "without_token", "old_token", "no_write")
    timings: dict[str, list[float]] = {kind: [] for kind in kinds}
    nodes: dict[str, dict[str, int]] = {key: {} for key in timings}
    old_token = ""
    for i in range(rounds):
        for kind in ("with_token", "without_token") if i % 2 else ("without_token", "with_token"):
            write = client.patch(path, json={"cache_ttl_seconds": 3600 + i})
            ok(write)
            token = write.headers[TOKEN]
            headers = {TOKEN: token} if kind == "with_token" else {}
            _timed_read(client, path, headers, kind, timings, nodes)
            old_token = old_token or token
    time.sleep(2.5)  # the replica is known current (checked every second) for the old token
    for i in range(rounds):
        for kind in ("old_token", "no_write") if i % 2 else ("no_write", "old_token"):
            headers = {TOKEN: old_token} if kind == "old_token" else {}
            _timed_read(client, path, headers, kind, timings, nodes)
    p50 = {kind: statistics.median(values) for kind, values in timings.items()}
    return {
        "rounds": rounds,
        **{f"{kind}_p50_ms": round(ms, 2) for kind, ms in p50.items()},
        "added_by_fresh_token_ms": round(p50["with_token"] - p50["without_token"], 2),
        "added_by_old_token_ms": round(p50["old_token"] - p50["no_write"], 2),
        "served_by": nodes,
    }


def _timed_read(
    client: httpx.Client,
    path: str,
    headers: dict[str, str],
    kind: str,
    timings: dict[str, list[float]],
    nodes: dict[str, dict[str, int]],
) -> None:
    started = time.perf_counter()
    response = client.get(path, headers=headers)
    timings[kind].append((time.perf_counter() - started) * 1000)
    ok(response)
    node = response.headers.get(NODE, "?")
    nodes[kind][node] = nodes[kind].get(node, 0) + 1


# -- failover --------------------------------------------------------------------------------


@dataclass
class _Reads:
    """Reads in a loop on their own thread: (sent, done, status, node) each."""

    client: httpx.Client
    path: str
    log: list[tuple[float, float, int, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            sent = time.monotonic()
            try:
                response = self.client.get(self.path)
                status, node = response.status_code, response.headers.get(NODE, "?")
            except httpx.HTTPError:
                status, node = 0, "?"
            self.log.append((sent, time.monotonic(), status, node))


def _failover(client: httpx.Client, cluster: DevCluster) -> dict[str, Any]:
    standby = next(s for s in cluster.standbys if s.name == "eu-1")
    reads = _Reads(_client(str(client.base_url), dict(client.headers)), "/v1/collections")
    thread = threading.Thread(target=reads.run)
    thread.start()
    try:
        time.sleep(1.0)
        stop_started = time.monotonic()
        standby.stop()
        stopped = time.monotonic()
        time.sleep(3.0)
        start_began = time.monotonic()
        standby.start()
        started = time.monotonic()
        deadline = started + 30
        while time.monotonic() < deadline and not _served_by(reads.log, "eu-1", started):
            time.sleep(0.05)
        time.sleep(0.5)
    finally:
        reads.stop.set()
        thread.join()
        reads.client.close()
    log = reads.log
    away = next(
        (done for sent, done, status, node in log if sent >= stop_started and node != "eu-1"),
        None,
    )
    back = _served_by(log, "eu-1", started)
    during = [entry for entry in log if entry[1] >= stop_started]
    return {
        "reads": len(log),
        "stop_command_s": round(stopped - stop_started, 3),
        "stop_to_first_read_elsewhere_ms": _ms(away, stop_started),
        "stopped_to_first_read_elsewhere_ms": _ms(away, stopped),
        "errors_after_stop": sum(1 for entry in during if entry[2] != 200),
        "reads_on_eu1_after_stopped": sum(
            1 for sent, _, status, node in log if stopped <= sent < start_began and node == "eu-1"
        ),
        "start_command_s": round(started - start_began, 3),
        "started_to_eu1_serving_ms": _ms(back, started),
    }


def _served_by(log: list[tuple[float, float, int, str]], node: str, since: float) -> float | None:
    return next((done for sent, done, _, n in log if sent >= since and n == node), None)


def _ms(at: float | None, since: float) -> float | None:
    return None if at is None else round((at - since) * 1000, 1)


# -- report ----------------------------------------------------------------------------------


def _report(results: dict[str, dict[str, Any]]) -> None:
    for part, figures in results.items():
        print(f"{part}:")
        for key, value in figures.items():
            print(f"  {key:<36} {value}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
