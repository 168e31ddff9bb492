"""A soak of mixed traffic: many clients for a long while against a running `ragservice serve`.

    python benchmarks/soak.py --collection scifact [--clients 16] [--minutes 30] [--url URL]

Each client thread, on its own kept-alive connection, draws operations from a weighted mix
(`--mix`, default search=60,ask=20,feedback=10,ingest=10): searches of `--collection` in each
mode, answers (`/v1/query`, half of them streamed), feedback on answers received, and small
uploads to a scratch collection made for the run (deleted at the end unless `--keep-scratch`),
whose jobs the client polls between its other operations (one job at a time). Responses are
recorded by route; a 429 is deliberate (counted apart; the client waits its `Retry-After`),
any other non-2xx status or exception is an error. After `--warmup-seconds` of the same traffic
(recorded apart), memory is sampled every `--sample-seconds` with a progress line: the server's
(the process on the URL's port, or `--server-pid`, and its children), each worker's
(`--worker-pid`) and the embedded PostgreSQL's (`--pgdata`). `--start-server` runs
`ragservice serve` itself on the URL's address, and `--workers N` as many `ragservice worker`s.
With authentication on the key must be a writer's (an admin's to delete the scratch
collection). docs/benchmarks.md says more. Prints a table and a final JSON line (`clients`,
`minutes`, `requests`, `errors`, `deliberate_429`, `routes`, `p99_ms`,
`rss_growth_after_warmup` by process from `--growth-from-minutes` on, `rss_growth_pct`, …).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# This folder goes last on the import path: `benchmarks/ingest.py` must not shadow `ingest`.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]

import httpx  # noqa: E402
from harness import (  # noqa: E402
    MemoryProbe,
    Sample,
    add_process_arguments,
    mb_text,
    memory_report,
    pct_text,
    percentile,
    server_pid,
    started_services,
)

OPERATIONS = ("search", "ask", "feedback", "ingest")
DEFAULT_MIX = "search=60,ask=20,feedback=10,ingest=10"
MODES = ("hybrid", "dense", "fulltext")
_BODY_CHARS = 500  # of an error's response body, when printed


# -- pure helpers ----------------------------------------------------------------------------


def parse_mix(text: str) -> dict[str, float]:
    """`search=60,ask=20,...` as weights by operation; unnamed operations weigh 0."""
    weights = dict.fromkeys(OPERATIONS, 0.0)
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or name.strip() not in weights:
            raise ValueError(f"{part!r}: expected NAME=WEIGHT with NAME one of {OPERATIONS}")
        try:
            weight = float(value)
        except ValueError:
            raise ValueError(f"{part!r}: the weight is not a number") from None
        if weight < 0:
            raise ValueError(f"{part!r}: a weight cannot be negative")
        weights[name.strip()] = weight
    if sum(weights.values()) <= 0:
        raise ValueError("the mix weighs nothing: give at least one operation a positive weight")
    return weights


def draw(weights: dict[str, float], rng: random.Random) -> str:
    """An operation, drawn with probability proportional to its weight."""
    names = list(weights)
    return rng.choices(names, weights=[weights[n] for n in names])[0]


def latency_summary(latencies_ms: list[float]) -> dict[str, float | None]:
    """p50 / p95 / p99 (nearest rank, as the other benchmarks), None when nothing succeeded."""
    if not latencies_ms:
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None}
    return {f"p{q}_ms": round(percentile(latencies_ms, q / 100), 2) for q in (50, 95, 99)}


def parse_sse(lines: Iterable[str]) -> Iterator[tuple[str, Any]]:
    """(event, data) of a text/event-stream, the data parsed as JSON."""
    name = "message"
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield name, json.loads("\n".join(data))
            name, data = "message", []
        elif line.startswith("event:"):
            name = line[len("event:") :].strip()
        elif line.startswith("data:"):
            data.append(line[len("data:") :].strip())
    if data:
        yield name, json.loads("\n".join(data))


def feedback_body(answer: Answered, rng: random.Random) -> dict[str, Any]:
    """Thumbs (or, one time in four, stars) on an answer, half the time with judged chunks."""
    if rng.random() < 0.25:
        body: dict[str, Any] = {"rating": rng.randint(1, 5), "scale": "stars"}
    else:
        body = {"rating": rng.choice((1, -1))}
    body["query_id"] = answer.query_id
    if answer.sources and rng.random() < 0.5:
        relevant = answer.sources[0][:2]
        body["relevant_chunk_ids"] = relevant
        if len(answer.sources) > 1:
            body["irrelevant_chunk_ids"] = [c for c in answer.sources[-1][:1] if c not in relevant]
    return body


# -- what was seen ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Answered:
    query_id: str
    sources: list[list[str]]  # the chunk ids of each source, best first


@dataclass
class Job:
    id: str
    started: float  # perf_counter() before its upload
    limit: float  # monotonic(): an error if not over by then
    next_poll: float  # monotonic()


@dataclass
class Route:
    latencies_ms: list[float] = field(default_factory=list)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    limited: int = 0

    def summary(self) -> dict[str, Any]:
        count = len(self.latencies_ms) + sum(self.errors.values()) + self.limited
        return {
            "count": count,
            **latency_summary(self.latencies_ms),
            "errors": dict(self.errors),
            "deliberate_429": self.limited,
        }


class Recorder:
    """Responses by route, thread-safe; keeps the first `samples` errors to print."""

    def __init__(self, samples: int) -> None:
        self._lock = threading.Lock()
        self.routes: dict[str, Route] = collections.defaultdict(Route)
        self.samples: list[str] = []
        self._max_samples = samples

    def ok(self, route: str, ms: float) -> None:
        with self._lock:
            self.routes[route].latencies_ms.append(ms)

    def limited(self, route: str) -> None:
        with self._lock:
            self.routes[route].limited += 1

    def error(self, route: str, status: str, detail: str) -> None:
        with self._lock:
            self.routes[route].errors[status] += 1
            if len(self.samples) < self._max_samples:
                line = f"{route} {status}: {detail[:_BODY_CHARS]}"
                self.samples.append(line)
                print(f"error: {line}", file=sys.stderr, flush=True)

    def totals(self) -> tuple[int, int, int]:
        """Requests, errors and 429s so far."""
        with self._lock:
            rows = [r.summary() for r in self.routes.values()]
        return (
            sum(r["count"] for r in rows),
            sum(sum(r["errors"].values()) for r in rows),
            sum(r["deliberate_429"] for r in rows),
        )

    def summary(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {name: self.routes[name].summary() for name in sorted(self.routes)}


# -- the clients -----------------------------------------------------------------------------


@dataclass
class Shared:
    args: argparse.Namespace
    weights: dict[str, float]
    queries: list[str]
    scratch: str
    recorder: Recorder
    deadline: float
    stop: threading.Event = field(default_factory=threading.Event)
    answers: collections.deque[Answered] = field(
        default_factory=lambda: collections.deque(maxlen=1000)
    )


class Client:
    """One simulated user: its own connection and random stream, operations until the end."""

    def __init__(self, shared: Shared, http: httpx.Client, number: int) -> None:
        self.shared, self.http, self.number = shared, http, number
        self.rng = random.Random(shared.args.seed * 1000 + number)
        self.uploads = 0
        self.job: Job | None = None  # its upload being processed

    def run(self) -> None:
        while not self.shared.stop.is_set() and time.monotonic() < self.shared.deadline:
            self._poll_job()
            operation = self._next_operation()
            if operation == "search":
                self.search()
            elif operation == "ask" or not self.shared.answers:
                self.ask()  # feedback needs an answer to be about
            elif operation == "feedback":
                self.feedback()
            else:
                self.ingest()
        while self.job is not None:  # the last upload is judged too
            self._poll_job(wait=True)

    def _next_operation(self) -> str:
        """Drawn from the mix; while the client's job runs, from the other operations."""
        operation = draw(self.shared.weights, self.rng)
        others = {k: w for k, w in self.shared.weights.items() if k != "ingest"}
        if operation == "ingest" and self.job is not None and sum(others.values()) > 0:
            return draw(others, self.rng)
        return operation

    def search(self) -> None:
        mode = self.rng.choice(MODES)
        body = {"query": self._query(), "collections": [self.shared.args.collection]}
        self._call(f"search/{mode}", "POST", "/v1/search", json={**body, "mode": mode, "k": 10})

    def ask(self) -> None:
        body: dict[str, Any] = {"question": self._query(), "k": 8}
        body |= {
            "collections": [self.shared.args.collection],
            "cache": not self.shared.args.no_cache,
        }
        if self.rng.random() < 0.5:
            found = self._call("query", "POST", "/v1/query", json=body)
            answer = None if found is None else found.json()
        else:
            answer = self._streamed({**body, "stream": True})
        if answer is not None:
            sources = [s["chunk_ids"] for s in answer.get("sources", [])]
            self.shared.answers.append(Answered(answer["query_id"], sources))

    def feedback(self) -> None:
        answer = self.rng.choice(list(self.shared.answers))
        self._call("feedback", "POST", "/v1/feedback", json=feedback_body(answer, self.rng))

    def ingest(self) -> None:
        while self.job is not None:  # one job of its own at a time: the queue stays bounded
            self._poll_job(wait=True)
        self.uploads += 1
        docs = [self._document(j) for j in range(self.shared.args.ingest_docs)]
        path = f"/v1/collections/{self.shared.scratch}/documents"
        started = time.perf_counter()
        queued = self._call("ingest/upload", "POST", path, json={"documents": docs})
        if queued is not None:
            limit = time.monotonic() + self.shared.args.job_timeout
            self.job = Job(queued.json()["id"], started, limit, time.monotonic())

    # -- helpers of the operations

    def _query(self) -> str:
        return self.rng.choice(self.shared.queries)

    def _document(self, j: int) -> dict[str, Any]:
        sentences = self.rng.sample(self.shared.queries, min(6, len(self.shared.queries)))
        return {
            "external_id": f"soak-{self.number}-{self.uploads}-{j}",
            "title": sentences[0][:120],
            "text": " ".join(sentences),
            "metadata": {"soak": True, "client": self.number},
        }

    def _poll_job(self, wait: bool = False) -> None:
        """Poll the client's job when its time has come (or wait for it); judge it when over."""
        job = self.job
        if job is None or (not wait and time.monotonic() < job.next_poll):
            return
        time.sleep(max(0.0, job.next_poll - time.monotonic()))
        found = self._call("ingest/poll", "GET", f"/v1/jobs/{job.id}")
        state = None if found is None else found.json()
        if state is not None and state["status"] in ("done", "failed"):
            self.job = None
            if state["status"] == "failed" or state["errors"]:
                problem = "job-failed" if state["status"] == "failed" else "job-errors"
                self.shared.recorder.error("ingest/job", problem, json.dumps(state))
            else:
                self.shared.recorder.ok("ingest/job", (time.perf_counter() - job.started) * 1000)
        elif time.monotonic() > job.limit:
            self.job = None
            self.shared.recorder.error("ingest/job", "job-timeout", f"job {job.id} not done")
        else:
            job.next_poll = time.monotonic() + self.shared.args.poll_seconds

    def _call(self, route: str, method: str, path: str, **kwargs: Any) -> httpx.Response | None:
        """The response when it is 2xx; None after recording a refusal or an error."""
        started = time.perf_counter()
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            self.shared.recorder.error(route, f"exception:{type(exc).__name__}", str(exc))
            return None
        return self._judge(route, response, (time.perf_counter() - started) * 1000)

    def _judge(self, route: str, response: httpx.Response, ms: float) -> httpx.Response | None:
        if response.status_code == 429:
            self.shared.recorder.limited(route)
            self._back_off(response)
            return None
        if not 200 <= response.status_code < 300:
            self.shared.recorder.error(route, str(response.status_code), response.text)
            return None
        self.shared.recorder.ok(route, ms)
        return response

    def _streamed(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """A streamed answer: its `done` event with the sources of its `citations` event."""
        route, started = "query/stream", time.perf_counter()
        try:
            with self.http.stream("POST", "/v1/query", json=body) as response:
                if response.status_code != 200:
                    response.read()
                    self._judge(route, response, 0.0)
                    return None
                events = dict(parse_sse(response.iter_lines()))
        except (httpx.HTTPError, ValueError) as exc:
            self.shared.recorder.error(route, f"exception:{type(exc).__name__}", str(exc))
            return None
        if "error" in events or "done" not in events:
            status = "stream-error" if "error" in events else "stream-incomplete"
            self.shared.recorder.error(route, status, json.dumps(events.get("error")))
            return None
        self.shared.recorder.ok(route, (time.perf_counter() - started) * 1000)
        return {**events["done"], **events.get("citations", {})}

    def _back_off(self, response: httpx.Response) -> None:
        try:
            wait = float(response.headers.get("retry-after", "1"))
        except ValueError:
            wait = 1.0
        self.shared.stop.wait(min(wait, max(0.0, self.shared.deadline - time.monotonic())))


# -- the run ---------------------------------------------------------------------------------


def main() -> None:
    args = _parse_args()
    queries = _load_queries(args.queries)
    with contextlib.ExitStack() as stack:
        if args.start_server:
            pid, workers = stack.enter_context(started_services(args.url, args.workers))
        else:
            pid, workers = args.server_pid or server_pid(args.url), tuple(args.worker_pid)
        pgdata = None if str(args.pgdata) == "none" else args.pgdata
        probe = MemoryProbe(pid, workers, pgdata)
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        with httpx.Client(base_url=args.url, headers=headers, timeout=args.timeout) as admin:
            _check_collection(admin, args.collection)
            _create(admin, args.scratch)
            try:
                report = _soak(args, queries, probe)
            finally:
                if not args.keep_scratch:
                    _delete(admin, args.scratch)
    _print_report(args, report)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key", default=os.environ.get("RAGSERVICE_API_KEY"))
    parser.add_argument("--collection", required=True, help="the collection searched and asked")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--mix", default=DEFAULT_MIX, help=f"weights (default {DEFAULT_MIX})")
    parser.add_argument(
        "--queries", type=Path, default=Path("../shared/data/scifact/queries.jsonl")
    )
    parser.add_argument("--scratch", default=None, help="default: soak-<random>")
    parser.add_argument("--keep-scratch", action="store_true", help="do not delete it at the end")
    parser.add_argument("--ingest-docs", type=int, default=3, help="documents per ingest job")
    parser.add_argument("--job-timeout", type=float, default=300.0, help="seconds")
    parser.add_argument("--poll-seconds", type=float, default=1.0, help="between job polls")
    parser.add_argument("--timeout", type=float, default=120.0, help="per request, seconds")
    add_process_arguments(parser)
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        default=60.0,
        help="traffic before the measured period (and its first memory sample), recorded apart",
    )
    parser.add_argument(
        "--no-cache", action="store_true", help="answers neither read nor write the prompt cache"
    )
    parser.add_argument("--error-samples", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    try:
        args.weights = parse_mix(args.mix)
    except ValueError as exc:
        parser.error(f"--mix: {exc}")
    if args.clients < 1 or args.minutes <= 0 or args.ingest_docs < 1:
        parser.error("--clients and --ingest-docs must be at least 1, --minutes above 0")
    if args.workers < 0 or (args.workers and not args.start_server):
        parser.error("--workers N starts workers with --start-server; else give --worker-pid")
    if not 0 <= args.growth_from_minutes < args.minutes:
        parser.error("--growth-from-minutes must be at least 0 and below --minutes")
    args.url = args.url.rstrip("/")
    args.scratch = args.scratch or f"soak-{uuid.uuid4().hex[:8]}"
    return args


def _load_queries(path: Path) -> list[str]:
    if not path.is_file():
        raise SystemExit(f"--queries: {path} is not a file (a BEIR queries.jsonl)")
    with path.open(encoding="utf-8") as lines:
        queries = [json.loads(line)["text"] for line in lines if line.strip()]
    if not queries:
        raise SystemExit(f"{path}: no queries")
    return queries


def _check_collection(http: httpx.Client, name: str) -> None:
    found = http.get(f"/v1/collections/{name}")
    if found.status_code != 200:
        raise SystemExit(f"collection {name!r}: {found.status_code} {found.text}")
    print(f"searching {name!r}: {found.json()['chunk_count']} chunks", file=sys.stderr)


def _create(http: httpx.Client, name: str) -> None:
    made = http.post("/v1/collections", json={"name": name, "description": "soak scratch"})
    if made.status_code != 201:
        raise SystemExit(f"scratch collection {name!r}: {made.status_code} {made.text}")


def _delete(http: httpx.Client, name: str) -> None:
    gone = http.delete(f"/v1/collections/{name}")
    if gone.status_code != 204:
        print(f"could not delete {name!r}: {gone.status_code} {gone.text}", file=sys.stderr)


def _soak(args: argparse.Namespace, queries: list[str], probe: MemoryProbe) -> dict[str, Any]:
    """Warm-up traffic (recorded apart), then the measured period with its memory samples."""
    cold = probe.sample()
    ends = time.monotonic() + args.warmup_seconds + args.minutes * 60
    shared = Shared(args, args.weights, queries, args.scratch, Recorder(args.error_samples), ends)
    with contextlib.ExitStack() as stack:
        threads = [
            threading.Thread(target=Client(shared, _http(args, stack), n).run, daemon=True)
            for n in range(args.clients)
        ]
        for thread in threads:
            thread.start()
        try:
            warmup = _warm_up(shared)
            started = time.monotonic()
            samples = [Sample(0.0, probe.sample())]
            _watch(shared, probe, samples, started)
        finally:
            shared.stop.set()
            for thread in threads:
                thread.join()
    samples.append(Sample(time.monotonic() - started, probe.sample()))
    return {
        "seconds": time.monotonic() - started,
        "samples": samples,
        "cold": cold,
        "warmup": warmup,
        "recorder": shared.recorder,
    }


def _http(args: argparse.Namespace, stack: contextlib.ExitStack) -> httpx.Client:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    client = httpx.Client(base_url=args.url, headers=headers, timeout=args.timeout)
    return stack.enter_context(client)


def _warm_up(shared: Shared) -> dict[str, Any]:
    """`--warmup-seconds` of the same traffic; then a fresh recorder for the measured period."""
    if shared.args.warmup_seconds <= 0:
        return {"seconds": 0, "requests": 0, "errors": 0, "deliberate_429": 0}
    print(f"warming up for {shared.args.warmup_seconds:.0f} s", file=sys.stderr, flush=True)
    shared.stop.wait(shared.args.warmup_seconds)
    warm, shared.recorder = shared.recorder, Recorder(shared.args.error_samples)
    requests, errors, limited = warm.totals()
    return {
        "seconds": shared.args.warmup_seconds,
        "requests": requests,
        "errors": errors,
        "deliberate_429": limited,
        "error_samples": warm.samples,
    }


def _watch(shared: Shared, probe: MemoryProbe, samples: list[Sample], started: float) -> None:
    """A memory sample and a progress line every `--sample-seconds` until the deadline."""
    last_requests, last_at = 0, started
    while not shared.stop.wait(min(shared.args.sample_seconds, shared.deadline - time.monotonic())):
        if time.monotonic() >= shared.deadline:
            return
        samples.append(Sample(time.monotonic() - started, probe.sample()))
        requests, errors, limited = shared.recorder.totals()
        now = time.monotonic()
        rate = (requests - last_requests) / (now - last_at)
        memory = ", ".join(
            f"{name} {mb_text(mb)} MB ({pct_text(samples[0].mb.get(name), mb)})"
            for name, mb in samples[-1].mb.items()
        )
        print(
            f"[{now - started:6.0f} s] {requests} requests ({rate:.1f}/s), {errors} errors, "
            f"{limited} 429s, {memory}",
            file=sys.stderr,
            flush=True,
        )
        last_requests, last_at = requests, now


def _print_report(args: argparse.Namespace, run: dict[str, Any]) -> None:
    routes = run["recorder"].summary()
    memory, lines = memory_report(run["samples"], run["cold"], args.growth_from_minutes)
    print(f"{'route':<18}{'count':>8}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}  errors  429")
    for name, row in routes.items():
        cells = [row[f"p{q}_ms"] for q in (50, 95, 99)]
        shown = "".join(f"{'-' if c is None else f'{c:.1f}':>10}" for c in cells)
        errors = ",".join(f"{k}:{v}" for k, v in row["errors"].items()) or "0"
        print(f"{name:<18}{row['count']:>8}{shown}  {errors}  {row['deliberate_429']}")
    for line in lines:
        print(line)
    for line in run["warmup"].get("error_samples", []):
        print(f"first errors of the warm-up: {line}")
    for line in run["recorder"].samples:
        print(f"first errors: {line}")
    summary = {
        "clients": args.clients,
        "minutes": args.minutes,
        "seconds": round(run["seconds"], 1),
        "mix": args.weights,
        "requests": sum(r["count"] for r in routes.values()),
        "errors": sum(sum(r["errors"].values()) for r in routes.values()),
        "deliberate_429": sum(r["deliberate_429"] for r in routes.values()),
        "routes": routes,
        "p99_ms": {name: row["p99_ms"] for name, row in routes.items()},
        **memory,
        "warmup": {k: v for k, v in run["warmup"].items() if k != "error_samples"},
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
