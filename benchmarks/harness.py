"""What the HTTP benchmarks share: a server to talk to, and a BEIR corpus loaded through the API.

`server(args)` yields the base URL and auth headers of `--url`, or of a `ragservice serve` it
starts on a free loopback port with its own data directory (`--data-dir`, authentication off).
`server_pid` finds the process serving a URL and `resident_mb` its memory (with children);
`MemoryProbe` samples a soak's processes (the API server, workers, the embedded PostgreSQL) and
`started_services` runs `ragservice serve` (and `ragservice worker`s) for one.
`connect` makes the `RagserviceClient` of a server (one pool of kept-alive connections).
`ensure_corpus` uploads `corpus.jsonl` as ingest jobs unless the collection already holds it;
documents with no text (some public BEIR collections have them) are reported and left out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil

from ragservice.client import Job, RagserviceClient
from ragservice.errors import NotFoundError

_UPLOAD_PART_BYTES = 24 * 2**20  # below the default per-file limit of 32 MiB
# What the JSONL loader's cleaning leaves nothing of: whitespace and C0 control characters.
# (`ingest.loaders` itself cannot be imported here: `benchmarks/ingest.py` shadows it.)
_BLANK = re.compile(r"[\s\x00-\x08\x0e-\x1f]*")


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """The dataset, and the server to use or start."""
    parser.add_argument("--data", type=Path, required=True, help="a BEIR dataset folder")
    parser.add_argument("--split", default="test")
    parser.add_argument("--collection", default=None, help="default: the dataset folder's name")
    parser.add_argument("--url", help="a running server; default: start one")
    parser.add_argument("--api-key", default=os.environ.get("RAGSERVICE_API_KEY"))
    parser.add_argument("--data-dir", type=Path, default=Path(".ragservice-eval"))


def parse(parser: argparse.ArgumentParser) -> argparse.Namespace:
    args = parser.parse_args()
    args.collection = args.collection or args.data.resolve().name
    return args


# -- the server ------------------------------------------------------------------------------


@contextlib.contextmanager
def server(
    args: argparse.Namespace, extra_env: dict[str, str] | None = None
) -> Iterator[tuple[str, dict[str, str]]]:
    """`extra_env` adds settings (RAGSERVICE_…) for a server this starts."""
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    if args.url:
        yield args.url.rstrip("/"), headers
        return
    port = free_port()
    env = {
        **os.environ,
        "RAGSERVICE_DATA_DIR": str(args.data_dir),
        "RAGSERVICE_AUTH_DISABLED": "1",
        "HF_HUB_OFFLINE": "1",
        "OMP_WAIT_POLICY": "PASSIVE",
        **(extra_env or {}),
    }
    env.pop("RAGSERVICE_DATABASE_URL", None)
    with tempfile.TemporaryFile(mode="w+") as log:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "ragservice"), "serve", "--port", str(port)],
            env={**env, "RAGSERVICE_HOST": "127.0.0.1"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_ready(base, process, log)
            yield base, headers
        finally:
            process.terminate()
            process.wait(timeout=60)


def connect(base: str, headers: dict[str, str], timeout: float = 600) -> RagserviceClient:
    """The client of the server `server` yielded, sending its auth headers."""
    return RagserviceClient.connect(base, headers=headers, timeout=timeout)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(base: str, process: subprocess.Popen[bytes], log: Any) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    log.seek(0)
    raise SystemExit(f"the server did not become ready:\n{log.read()[-4000:]}")


def server_pid(url: str) -> int:
    """The process listening on the URL's port, else the one running `ragservice serve`."""
    port = urlsplit(url).port or (443 if url.startswith("https") else 80)
    for conn in psutil.net_connections(kind="tcp"):
        listening = conn.status == psutil.CONN_LISTEN and conn.laddr
        if listening and conn.laddr.port == port and conn.pid is not None:
            return int(conn.pid)
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if any(part.endswith("ragservice") for part in cmdline) and "serve" in cmdline:
            return int(process.pid)
    raise SystemExit(f"no process found serving {url}: pass --server-pid")


def resident_mb(pid: int) -> float:
    """Resident memory of the process and its children (embedded PostgreSQL is not one)."""
    process = psutil.Process(pid)
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += child.memory_info().rss
    return round(float(total) / 2**20, 1)


def add_process_arguments(parser: argparse.ArgumentParser) -> None:
    """A soak's processes: the server (found or started), its workers, the PostgreSQL server
    sampled, and when memory is sampled."""
    parser.add_argument("--server-pid", type=int, default=None)
    parser.add_argument(
        "--worker-pid", type=int, action="append", default=[], help="a running worker (repeat)"
    )
    parser.add_argument(
        "--pgdata",
        type=Path,
        default=default_pgdata(),
        help="the embedded PostgreSQL's data folder, whose postmaster.pid names the server "
        "sampled (default: RAGSERVICE_DATA_DIR's pgdata; 'none': not sampled)",
    )
    parser.add_argument("--start-server", action="store_true")
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        help="with --start-server: also start N `ragservice worker`s, which take the jobs",
    )
    parser.add_argument(
        "--growth-from-minutes",
        type=float,
        default=10.0,
        help="rss_growth_after_warmup runs from this minute of the measured period to its end",
    )
    parser.add_argument("--sample-seconds", type=float, default=30.0)


@dataclass(frozen=True)
class MemoryProbe:
    """The memory of a soak's processes, in MB by name: `api` (the server with its children),
    `worker-1`… (each `ragservice worker`, with its children) and, given the embedded server's
    data directory, `postgres` (the postmaster and every backend: proportional set sizes
    summed, so that shared memory counts once). A process gone reads None."""

    server: int
    workers: tuple[int, ...] = ()
    pgdata: Path | None = None

    def sample(self) -> dict[str, float | None]:
        found: dict[str, float | None] = {"api": _tree_mb(self.server)}
        for number, pid in enumerate(self.workers, start=1):
            found[f"worker-{number}"] = _tree_mb(pid)
        if self.pgdata is not None:
            found["postgres"] = postgres_mb(self.pgdata)
        return found


def _tree_mb(pid: int) -> float | None:
    try:
        return resident_mb(pid)
    except psutil.Error:
        return None


def postgres_mb(pgdata: Path) -> float | None:
    """The memory of the PostgreSQL server of `pgdata` (its postmaster.pid names the
    postmaster) and of all its backends: PSS where readable, else RSS; None when not running."""
    try:
        postmaster = psutil.Process(int((pgdata / "postmaster.pid").read_text().split()[0]))
        processes = [postmaster, *postmaster.children(recursive=True)]
    except (OSError, ValueError, IndexError, psutil.Error):
        return None
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            try:
                total += process.memory_full_info().pss
            except psutil.AccessDenied:
                total += process.memory_info().rss
    return round(float(total) / 2**20, 1)


@contextlib.contextmanager
def started_services(url: str, workers: int = 0) -> Iterator[tuple[int, tuple[int, ...]]]:
    """`ragservice serve` on the URL's host and port with this environment, and `workers`
    `ragservice worker` processes (the server then runs no job threads, RAGSERVICE_WORKERS=0,
    so that the workers take the jobs), until the end: (server pid, worker pids)."""
    parts = urlsplit(url)
    binary = str(Path(sys.executable).parent / "ragservice")
    command = [binary, "serve", "--host", parts.hostname or "127.0.0.1"]
    command += ["--port", str(parts.port or 8000)]
    env = {**os.environ, **({"RAGSERVICE_WORKERS": "0"} if workers else {})}
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(tempfile.TemporaryFile(mode="w+"))
        server = subprocess.Popen(command, env=env, stdout=log, stderr=log)
        stack.callback(_stop, server)
        wait_ready(url, server, log)
        started = []
        for _ in range(workers):
            worker_env = {k: v for k, v in os.environ.items() if k != "RAGSERVICE_WORKERS"}
            worker = subprocess.Popen([binary, "worker"], env=worker_env, stdout=log, stderr=log)
            stack.callback(_stop, worker)
            started.append(worker)
        yield server.pid, tuple(w.pid for w in started)


def _stop(process: subprocess.Popen[Any]) -> None:
    process.terminate()
    process.wait(timeout=60)


def default_pgdata() -> Path:
    """The embedded server's data directory of this environment's RAGSERVICE_DATA_DIR."""
    return Path(os.environ.get("RAGSERVICE_DATA_DIR", ".ragservice")).resolve() / "pgdata"


@dataclass(frozen=True)
class Sample:
    """A `MemoryProbe` sample, taken `seconds` into a soak's measured period."""

    seconds: float
    mb: dict[str, float | None]


def mb_text(value: float | None) -> str:
    """MB as a whole number for a progress line; `-` when unknown."""
    return "-" if value is None else f"{value:.0f}"


def pct_text(start: float | None, end: float | None) -> str:
    """Growth as a signed percentage for a progress line; `-` when unknown."""
    fraction = growth_fraction(start, end)
    return "-" if fraction is None else f"{fraction * 100:+.1f}%"


def growth_window(samples: list[Sample], from_seconds: float) -> dict[str, Any]:
    """Growth by process from the sample nearest `from_seconds` to the last: the fraction by
    process, and the window's ends (seconds into the measured period, MB by process)."""
    first = min(samples[:-1] or samples, key=lambda s: abs(s.seconds - from_seconds))
    last = samples[-1]
    return {
        "growth": {name: growth_fraction(first.mb.get(name), mb) for name, mb in last.mb.items()},
        "window": {
            "from_seconds": round(first.seconds, 1),
            "to_seconds": round(last.seconds, 1),
            "start_mb": first.mb,
            "end_mb": last.mb,
        },
    }


def memory_report(
    samples: list[Sample], cold: dict[str, float | None], from_minutes: float
) -> tuple[dict[str, Any], list[str]]:
    """A soak's memory: the fields of its final JSON line, and the lines printed before it.

    `rss_growth_after_warmup`: by process, the growth from the sample nearest `from_minutes`
    into the measured period to the last sample, as a fraction; `rss_growth_window` says which
    samples those were. The `rss_*` fields without `by_process` are the API server's."""
    after = growth_window(samples, from_minutes * 60)
    window = {"from_minutes": from_minutes, **after["window"]}
    by_process = {name: [sample.mb.get(name) for sample in samples] for name in samples[0].mb}
    series = by_process["api"]
    fields = {
        "rss_growth_after_warmup": after["growth"],
        "rss_growth_window": window,
        "rss_start_mb": series[0],
        "rss_end_mb": series[-1],
        "rss_growth_pct": growth_percent(series[0], series[-1]),
        "rss_series_mb": series,
        "rss_series_by_process_mb": by_process,
        "rss_sample_seconds": [round(sample.seconds, 1) for sample in samples],
        "rss_cold_mb": cold["api"],
        "rss_cold_by_process_mb": cold,
        "workers": sum(name.startswith("worker-") for name in cold),
    }
    lines = [f"MB before the warm-up: {', '.join(f'{k} {mb_text(v)}' for k, v in cold.items())}"]
    seconds = " ".join(f"{sample.seconds:.0f}" for sample in samples)
    lines.append(f"MB sampled at {seconds} s into the measured period:")
    lines += [f"  {name}: {' '.join(map(mb_text, values))}" for name, values in by_process.items()]
    growth = ", ".join(
        f"{name} {pct_text(window['start_mb'].get(name), mb)}"
        for name, mb in window["end_mb"].items()
    )
    lines.append(
        f"growth from {window['from_seconds']:.0f} s to {window['to_seconds']:.0f} s: {growth}"
    )
    return fields, lines


def growth_percent(start: float | None, end: float | None) -> float | None:
    """(end - start) / start in percent, 2 decimals; None when either is unknown."""
    fraction = growth_fraction(start, end)
    return None if fraction is None else round(fraction * 100, 2)


def growth_fraction(start: float | None, end: float | None) -> float | None:
    """(end - start) / start, 4 decimals; None when either is unknown."""
    if start is None or end is None or start <= 0:
        return None
    return round((end - start) / start, 4)


# -- the corpus ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CorpusCensus:
    """What a BEIR `corpus.jsonl` holds: the documents the server will store, and the ids of
    those with no text, which the loader refuses ("no text could be extracted")."""

    documents: int
    empty_ids: list[str]

    def summary(self, shown: int = 5) -> dict[str, Any]:
        """For a benchmark's final JSON line: the count and the first `shown` ids."""
        return {"count": len(self.empty_ids), "ids": self.empty_ids[:shown]}


def corpus_census(corpus: Path) -> CorpusCensus:
    """Count the documents of `corpus`; a row whose text is missing or blank (nothing left
    once the JSONL loader has cleaned it) is an empty document. Blank lines are not rows."""
    documents, empty = 0, []
    with corpus.open(encoding="utf-8") as lines:
        for line in lines:
            if not line.strip():
                continue
            row = json.loads(line)
            text = row.get("text")
            if isinstance(text, str) and not _BLANK.fullmatch(text):
                documents += 1
            else:
                empty.append(str(row.get("_id")))
    return CorpusCensus(documents, empty)


def ensure_corpus(client: RagserviceClient, collection: str, corpus: Path) -> CorpusCensus:
    census = corpus_census(corpus)
    if census.empty_ids:
        shown = ", ".join(census.empty_ids[:5]) + (", …" if len(census.empty_ids) > 5 else "")
        print(
            f"corpus: {len(census.empty_ids)} documents have no text and are left out ({shown})",
            file=sys.stderr,
        )
    expected = census.documents
    try:
        found = client.collection(collection)["document_count"]
    except NotFoundError:
        client.create_collection(collection)
    else:
        if found == expected:
            print(f"corpus: reusing {expected} documents in {collection!r}", file=sys.stderr)
            return census
    started = time.perf_counter()
    for number, part in enumerate(upload_parts(corpus)):
        job = client.upload_files(collection, [(f"{corpus.stem}-{number}.jsonl", part)])
        wait_job(client, job["id"])
    count = client.collection(collection)["document_count"]
    seconds = time.perf_counter() - started
    print(f"corpus: {count} documents ingested in {seconds:.0f} s", file=sys.stderr)
    if count != expected:
        raise SystemExit(f"expected {expected} documents in {collection!r}, found {count}")
    return census


def upload_parts(corpus: Path) -> Iterator[bytes]:
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


def wait_job(client: RagserviceClient, job_id: str) -> None:
    """Wait for the ingest job, printing each change of its status and counts; exit when it
    failed."""
    shown = [""]

    def progress(job: Job) -> None:
        line = f"job {job_id[:8]}: {job['status']} {json.dumps(job['counts'])}"
        if line != shown[0]:
            print(line, file=sys.stderr)
            shown[0] = line

    job = client.wait_job(job_id, timeout=float("inf"), interval=2, on_poll=progress)
    if job["status"] == "failed":
        raise SystemExit(f"ingest failed: {job['errors']}")
    if job["errors"]:
        print(f"  {len(job['errors'])} rows failed: {job['errors'][:3]}", file=sys.stderr)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ok(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise SystemExit(
            f"{response.request.method} {response.request.url}: "
            f"{response.status_code} {response.text}"
        )
    return response.json()
