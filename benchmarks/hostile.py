"""Search latency over HTTP while an ingest worker parses a hostile file, against an idle server.

    python benchmarks/hostile.py --data ../shared/data/scifact [--queries 300] [--parse-timeout 20]

Starts `ragservice serve` (its own `--data-dir`, default `.ragservice-hostile`, with
`RAGSERVICE_PARSE_TIMEOUT_SECONDS` set to `--parse-timeout`) and loads the corpus through the
API once (`harness.ensure_corpus`; a later run reuses it). Then, on one kept-alive connection:

1. idle: the test queries through `POST /v1/search` (hybrid, k = 10), one at a time;
2. hostile: a ~30 MB HTML file of very many small tags is uploaded to a collection of its own
   (`POST /v1/collections/{name}/documents/files`); as soon as its job is `running` (the
   server's ingest worker is parsing it, in its sandboxed child process) the same queries are
   sent again. Only the searches that finished before the job did count.

The job must end with the per-file error "parsing took longer than N s": the parser is stopped
at its limit. Prints a table and a final JSON line (idle and hostile p50 / p95, their ratio,
the parse error, the job's seconds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime
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

from ragservice.client import Job, JobStatus, RagserviceClient, SearchResponse  # noqa: E402
from ragservice.embedding.evaluation import load_beir_queries  # noqa: E402
from ragservice.errors import NotFoundError  # noqa: E402

# Each `<p>` costs BeautifulSoup a Python object or two; 30 MB of them is far more than the
# parser can build in the time it is given, while the file stays under the 32 MiB upload limit.
_HOSTILE_TAG = b"<p>a b</p>"


def hostile_html(megabytes: float) -> bytes:
    count = int(megabytes * 1e6) // len(_HOSTILE_TAG)
    return b"<html><body>" + _HOSTILE_TAG * count + b"</body></html>"


def main() -> None:
    args = _parse_args()
    queries = list(load_beir_queries(args.data, args.split).texts.values())[: args.queries]
    hostile = hostile_html(args.hostile_mb)
    env = {"RAGSERVICE_PARSE_TIMEOUT_SECONDS": str(args.parse_timeout)}
    with (
        server(args, env) as (base, headers),
        connect(base, headers) as client,
    ):
        ensure_corpus(client, args.collection, args.data / "corpus.jsonl")
        for query in queries[: args.warmup]:
            _search(client, args.collection, query)
        idle = [ms for ms, _ in _timed_searches(client, args.collection, queries)]
        result = _hostile_phase(client, args, queries, hostile)
    _report(args, idle, result, len(hostile))


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.set_defaults(data_dir=Path(".ragservice-hostile"))
    parser.add_argument("--queries", type=int, default=300, help="searches per phase")
    parser.add_argument("--warmup", type=int, default=20, help="untimed searches first")
    parser.add_argument(
        "--parse-timeout", type=float, default=20.0, help="RAGSERVICE_PARSE_TIMEOUT_SECONDS"
    )
    parser.add_argument("--hostile-mb", type=float, default=30.0, help="size of the HTML file")
    parser.add_argument("--hostile-collection", default="hostile")
    return parse(parser)


def _hostile_phase(
    client: RagserviceClient, args: argparse.Namespace, queries: list[str], hostile: bytes
) -> dict[str, Any]:
    name = args.hostile_collection
    try:
        client.collection(name)
    except NotFoundError:
        client.create_collection(name)
    uploaded = time.perf_counter()
    job_id = client.upload_files(name, [("hostile.html", hostile)])["id"]
    upload_s = time.perf_counter() - uploaded
    job = _wait_for(client, job_id, {"running", "done", "failed"})
    if job["status"] != "running":
        raise SystemExit(f"the job ended before the searches began: {job}")
    timed = _timed_searches(client, args.collection, queries)
    status_after = client.job(job_id)["status"]
    job = _wait_for(client, job_id, {"done", "failed"})
    ended = _timestamp(job["finished_at"])
    during = [ms for ms, finished in timed if finished <= ended]
    errors = [error["error"] for error in job["errors"]]
    return {
        "latencies": during,
        "searches_after_the_job": len(timed) - len(during),
        "status_after_searches": status_after,
        "job": job,
        "parse_error": errors[0] if errors else None,
        "job_seconds": _timestamp(job["finished_at"]) - _timestamp(job["started_at"]),
        "upload_seconds": upload_s,
    }


def _wait_for(client: RagserviceClient, job_id: str, statuses: set[JobStatus]) -> Job:
    try:
        return client.wait_job(job_id, until=statuses, timeout=600, interval=0.05)
    except TimeoutError:
        raise SystemExit(f"job {job_id} never reached {sorted(statuses)}") from None


def _timed_searches(
    client: RagserviceClient, collection: str, queries: list[str]
) -> list[tuple[float, float]]:
    """(milliseconds, wall-clock time it finished) of each search."""
    rows = []
    for query in queries:
        started = time.perf_counter()
        _search(client, collection, query)
        rows.append(((time.perf_counter() - started) * 1000, time.time()))
    return rows


def _search(client: RagserviceClient, collection: str, query: str) -> SearchResponse:
    return client.search(query, collections=[collection], mode="hybrid", k=10)


def _timestamp(value: str | None) -> float:
    if value is None:
        raise SystemExit("a job that ended has no start or end time")
    return datetime.fromisoformat(value).timestamp()


def _report(
    args: argparse.Namespace, idle: list[float], hostile: dict[str, Any], size: int
) -> None:
    during = hostile["latencies"]
    if not during:
        raise SystemExit("no search finished while the hostile job was running")
    rows = {"idle": idle, "hostile": during}
    print(f"{'phase':<10}{'searches':>10}{'p50 ms':>10}{'p95 ms':>10}{'max ms':>10}")
    for phase, values in rows.items():
        p50, p95 = statistics.median(values), percentile(values, 0.95)
        print(f"{phase:<10}{len(values):>10}{p50:>10.2f}{p95:>10.2f}{max(values):>10.2f}")
    print(
        f"job: {hostile['job']['status']}, {hostile['job_seconds']:.1f} s, {hostile['parse_error']}"
    )
    idle_p95, hostile_p95 = percentile(idle, 0.95), percentile(during, 0.95)
    summary = {
        "dataset": args.data.resolve().name,
        "queries": len(idle),
        "idle_p50_ms": round(statistics.median(idle), 2),
        "idle_p95_ms": round(idle_p95, 2),
        "hostile_p50_ms": round(statistics.median(during), 2),
        "hostile_p95_ms": round(hostile_p95, 2),
        "p95_ratio": round(hostile_p95 / idle_p95, 3),
        "hostile_searches": len(during),
        "searches_after_the_job": hostile["searches_after_the_job"],
        "hostile_bytes": size,
        "parse_timeout_s": args.parse_timeout,
        "parse_error": hostile["parse_error"],
        "job_status": hostile["job"]["status"],
        "job_seconds": round(hostile["job_seconds"], 2),
        "upload_seconds": round(hostile["upload_seconds"], 2),
    }
    print(json.dumps(summary))
    expected = "parsing took longer than"
    if not (hostile["parse_error"] or "").startswith(expected):
        raise SystemExit(f"expected the per-file error {expected!r}: {hostile['job']['errors']}")


if __name__ == "__main__":
    main()
