"""What the HTTP benchmarks share: a server to talk to, and a BEIR corpus loaded through the API.

`server(args)` yields the base URL and auth headers of `--url`, or of a `ragservice serve` it
starts on a free loopback port with its own data directory (`--data-dir`, authentication off).
`server_pid` finds the process serving a URL and `resident_mb` its memory (with children).
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
