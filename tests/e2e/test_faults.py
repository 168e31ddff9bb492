"""Faults done to a real `ragservice serve` process and a real PostgreSQL.

- The server is killed with SIGKILL in the middle of an ingest job: what committed is whole
  documents only, and after a restart the job is taken over at once (its claim's advisory lock
  died with the process; the heartbeat timeout stays at its default 120 s) and finishes (or, on
  its last attempt, fails, and the same upload sent again completes it).
- PostgreSQL is stopped and started again (three times) under a loop of searches: requests fail
  with 503 in the error shape while it is down, and the service recovers by itself; an ingest
  job running across a restart is retried, not failed.
- The inference upstream hangs past the read timeout, then is gone: `/v1/query` answers 504,
  then 502, while `/v1/search` on the same server keeps answering.

The SIGKILL tests use the session's PostgreSQL (a database per test); the others share one
server on a PostgreSQL of this module's own, which they restart. Each test prints a
`FAULTS {json}` line with its figures (run pytest with `-s` to see them; `benchmarks/faults.py`
collects them). Everything listens on 127.0.0.1 or a Unix socket.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, LiteralString

import httpx
import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from ragservice.db import migrate
from ragservice.db.engine import SERVICE_LOGIN, ensure_service_login
from ragservice.dev.cluster import DevCluster, Standby, libpq_url
from tests.e2e.test_server import create_key, start_server, wait_for_job, wait_until_ready
from tests.upstream import FakeOpenAI, slow

pytestmark = pytest.mark.slow

DOCUMENTS = 30
RESTARTS = 3
SEARCH_THREADS = 4
JOB_DOCUMENTS = 120
OUTAGE_SECONDS = 1.0
RECOVERY_LIMIT_SECONDS = 5.0


def report(name: str, figures: dict[str, Any]) -> None:
    """One line per scenario for `benchmarks/faults.py` (and for a reader of `pytest -s`)."""
    print(f"FAULTS {json.dumps({'scenario': name, **figures}, sort_keys=True)}")


@dataclass
class Server:
    """A `ragservice serve` that can be killed and started again with the same environment.

    Its stderr is read all along: a server logging every failed request during an outage
    would otherwise fill the pipe and block on its next log line.
    """

    env: dict[str, str]
    base: str = ""
    process: subprocess.Popen[str] | None = None
    _stderr: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None

    def start(self) -> float:
        """Start and wait until ready; the seconds that took."""
        started = time.monotonic()
        self.base, self.process = start_server(self.env)
        wait_until_ready(self.base, self.process)
        self._stderr = []
        self._reader = threading.Thread(target=self._read, args=(self.process,), daemon=True)
        self._reader.start()
        return time.monotonic() - started

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self._wait()

    def stop(self) -> str:
        """SIGTERM, and check the shutdown was graceful; the server's stderr."""
        assert self.process is not None
        self.process.terminate()
        self._wait()
        stderr = self.stderr()
        assert self.process.returncode in (0, -signal.SIGTERM), stderr[-4000:]
        assert "Application shutdown complete" in stderr
        return stderr

    def client(self, headers: dict[str, str] | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.base, headers=headers or {}, timeout=30)

    def stderr(self) -> str:
        """What the server wrote to stderr so far."""
        return "".join(self._stderr)

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stderr is not None
        for line in process.stderr:
            self._stderr.append(line)

    def _wait(self) -> None:
        if self.process is not None:
            self.process.wait(timeout=30)
        if self._reader is not None:
            self._reader.join(timeout=30)


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    """Servers a test starts; whichever still runs at the end is killed."""
    started: list[Server] = []
    try:
        yield started
    finally:
        for server in started:
            server.kill()


# -- 1. SIGKILL in the middle of an ingest job -------------------------------------------------


def generated_documents(count: int) -> list[dict[str, Any]]:
    """`count` distinct documents of several short chunks each (64-token chunks below)."""
    words = "pump valve impeller bearing seal shaft motor gasket flange nozzle rotor casing"
    vocabulary = words.split()
    documents = []
    for n in range(count):
        sentences = [
            f"Manual {n} section {s}: the {vocabulary[(n + s) % 12]} needs the "
            f"{vocabulary[(n * 7 + s) % 12]} checked every {s + n} hours before the "
            f"{vocabulary[(n * 3 + s * 5) % 12]} is started again by the operator on duty."
            for s in range(8)
        ]
        documents.append({"external_id": f"doc-{n:03d}", "text": " ".join(sentences)})
    return documents


_HALF_WRITTEN: dict[str, LiteralString] = {
    "without_chunks": """
        SELECT count(*) FROM documents d WHERE d.collection_id = %(c)s
        AND NOT EXISTS (SELECT 1 FROM chunks k WHERE k.document_id = d.id)""",
    "chunk_count_differs": """
        SELECT count(*) FROM documents d WHERE d.collection_id = %(c)s
        AND d.chunk_count <> (SELECT count(*) FROM chunks k WHERE k.document_id = d.id)""",
    "ordinal_gaps": """
        SELECT count(*) FROM (
            SELECT document_id FROM chunks WHERE collection_id = %(c)s GROUP BY document_id
            HAVING min(ordinal) <> 0 OR max(ordinal) <> count(*) - 1) gaps""",
    "chunks_without_embedding": """
        SELECT count(*) FROM chunks k WHERE k.collection_id = %(c)s AND NOT EXISTS (
            SELECT 1 FROM chunk_embeddings e JOIN embedding_models m ON m.id = e.model_id
            WHERE e.chunk_id = k.id AND m.active)""",
    "text_stats_differ": """
        SELECT count(*) FROM (SELECT sum(chunk_count) AS n FROM collection_text_stats
                              WHERE collection_id = %(c)s) s
        WHERE s.n <> (SELECT count(*) FROM chunks k WHERE k.collection_id = %(c)s)""",
}

# Documents of collection `c` unlike those of a clean ingest (collection `r`) or missing there,
# and the other way round: the hash, or the chunks in order.
_DIFFERS_FROM_CLEAN: LiteralString = """
    WITH shape AS (
        SELECT d.collection_id, d.external_id, d.content_hash,
               array_agg(k.content_hash ORDER BY k.ordinal) AS chunks
        FROM documents d LEFT JOIN chunks k ON k.document_id = d.id
        WHERE d.collection_id IN (%(c)s, %(r)s)
        GROUP BY d.collection_id, d.external_id, d.content_hash)
    SELECT count(*)
    FROM (SELECT * FROM shape WHERE collection_id = %(c)s) a
    FULL JOIN (SELECT * FROM shape WHERE collection_id = %(r)s) b USING (external_id)
    WHERE a.content_hash IS DISTINCT FROM b.content_hash OR a.chunks IS DISTINCT FROM b.chunks"""

# Damage done by hand, to show the checks see it: a chunk cut from the middle of one document,
# the vector of another document's first chunk deleted.
_DAMAGE: tuple[LiteralString, ...] = (
    """DELETE FROM chunks WHERE id = (SELECT id FROM chunks
        WHERE collection_id = %(c)s AND ordinal = 1 ORDER BY document_id LIMIT 1)""",
    """DELETE FROM chunk_embeddings WHERE chunk_id = (SELECT id FROM chunks
        WHERE collection_id = %(c)s AND ordinal = 0 ORDER BY document_id DESC LIMIT 1)""",
)


def _scalar(conn: psycopg.Connection[Any], query: LiteralString, **params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def _collection(conn: psycopg.Connection[Any], name: str) -> Any:
    return _scalar(conn, "SELECT id FROM collections WHERE name = %(n)s", n=name)


def _stored_documents(conn: psycopg.Connection[Any], collection: Any) -> tuple[int, int]:
    """Documents in the collection, and distinct external ids among them."""
    row = conn.execute(
        "SELECT count(*), count(DISTINCT external_id) FROM documents WHERE collection_id = %s",
        (collection,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def half_written(conn: psycopg.Connection[Any], collection: Any) -> dict[str, int]:
    return {name: int(_scalar(conn, query, c=collection)) for name, query in _HALF_WRITTEN.items()}


def _started(conn: psycopg.Connection[Any], job_id: str) -> float:
    """When the job's latest attempt was claimed (epoch seconds; the same host's clock)."""
    query: LiteralString = "SELECT extract(epoch FROM started_at) FROM ingest_jobs WHERE id = %(j)s"
    return float(_scalar(conn, query, j=job_id))


def _job(conn: psycopg.Connection[Any], job_id: str) -> tuple[str, int]:
    row = conn.execute(
        "SELECT status, attempts FROM ingest_jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


def wait_for_partial_ingest(
    conn: psycopg.Connection[Any], collection: Any, job_id: str, total: int
) -> int:
    """Poll until about a third of the documents are committed while the job still runs."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        stored, _ = _stored_documents(conn, collection)
        status, _ = _job(conn, job_id)
        assert status in ("queued", "running"), f"the job ended before the kill: {status}"
        if total // 3 <= stored < total - 5:
            return stored
        time.sleep(0.02)
    raise AssertionError("the job never got under way")


def _ingest_env(server_env: dict[str, str]) -> dict[str, str]:
    return {
        **server_env,
        "RAGSERVICE_AUTH_DISABLED": "1",
        "RAGSERVICE_WORKERS": "1",
        "RAGSERVICE_CHUNK_MAX_TOKENS": "64",
        "RAGSERVICE_CHUNK_OVERLAP_TOKENS": "8",
        "RAGSERVICE_INGEST_BATCH_CHUNKS": "8",
    }


@dataclass(frozen=True)
class Killed:
    """What an upload left when its server was killed in the middle of it."""

    job_id: str
    collection: Any
    documents: int  # committed before the kill
    half_written: dict[str, int]


def upload_and_kill(
    server: Server, conn: psycopg.Connection[Any], documents: list[dict[str, Any]]
) -> Killed:
    """Upload `documents` as one job to a new collection `manuals`, SIGKILL the server once some
    of them are committed, and look at what is stored."""
    with server.client() as client:
        assert client.post("/v1/collections", json={"name": "manuals"}).status_code == 201
        upload = client.post("/v1/collections/manuals/documents", json={"documents": documents})
        assert upload.status_code == 202, upload.text
    job_id = upload.json()["id"]
    collection = _collection(conn, "manuals")
    wait_for_partial_ingest(conn, collection, job_id, len(documents))
    server.kill()
    assert _job(conn, job_id) == ("running", 1)  # its worker died holding it
    stored, _ = _stored_documents(conn, collection)
    return Killed(job_id, collection, stored, half_written(conn, collection))


def test_sigkill_mid_ingest_leaves_whole_documents_and_the_job_finishes_after_restart(
    server_env: dict[str, str], database_url: str, servers: list[Server]
) -> None:
    server = Server(_ingest_env(server_env))
    servers.append(server)
    server.start()
    documents = generated_documents(DOCUMENTS)
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        killed = upload_and_kill(server, conn, documents)
        killed_at = time.monotonic()
        restarted_at = time.time()
        restart_s = server.start()
        ready_at = time.time()
        with server.client() as client:
            job = wait_for_job(client, killed.job_id)
            job_done_s = time.monotonic() - killed_at
            resumed_at = _started(conn, killed.job_id)
            # A clean ingest of the same documents, to compare every document's chunks with.
            assert client.post("/v1/collections", json={"name": "clean"}).status_code == 201
            clean = client.post("/v1/collections/clean/documents", json={"documents": documents})
            assert wait_for_job(client, clean.json()["id"])["status"] == "done"
            hits = client.post("/v1/search", json={"query": "impeller seal", "k": 3}).json()
        server.stop()
        after, distinct = _stored_documents(conn, killed.collection)
        after_rerun = half_written(conn, killed.collection)
        clean_id = _collection(conn, "clean")
        differs = int(_scalar(conn, _DIFFERS_FROM_CLEAN, c=killed.collection, r=clean_id))
        for damage in _DAMAGE:
            conn.execute(damage, {"c": killed.collection})
        damaged = half_written(conn, killed.collection)
        damaged_differ = int(_scalar(conn, _DIFFERS_FROM_CLEAN, c=killed.collection, r=clean_id))
    report(
        "sigkill_mid_ingest",
        {
            "documents": DOCUMENTS,
            "docs_before_kill": killed.documents,
            "docs_after_rerun": after,
            "half_written_after_kill": sum(killed.half_written.values()),
            "half_written_after_rerun": sum(after_rerun.values()),
            "differ_from_clean_ingest": differs,
            "restart_ready_s": round(restart_s, 2),
            "restart_to_resumed_s": round(resumed_at - restarted_at, 2),
            "ready_to_resumed_s": round(resumed_at - ready_at, 2),
            "kill_to_job_done_s": round(job_done_s, 2),
            "attempts": job["attempts"],
        },
    )
    assert 0 < killed.documents < DOCUMENTS
    assert killed.half_written == dict.fromkeys(_HALF_WRITTEN, 0)
    assert (job["status"], job["attempts"]) == ("done", 2), job
    # Taken over as the restarted server's worker starts (just before it is ready), not after
    # the 120 s heartbeat timeout: the dead process's claim died with its connection.
    assert resumed_at - ready_at < 2.0, (restarted_at, resumed_at, ready_at)
    # The second attempt skips what the first committed (same content hash).
    assert job["counts"]["unchanged"] == killed.documents
    assert (job["counts"]["new"], job["counts"]["failed"]) == (DOCUMENTS - killed.documents, 0)
    assert after_rerun == dict.fromkeys(_HALF_WRITTEN, 0)
    assert (after, distinct, differs) == (DOCUMENTS, DOCUMENTS, 0)
    assert len(hits["results"]) == 3
    # The checks are not blind: the damage done by hand afterwards is found.
    assert damaged == {
        **dict.fromkeys(_HALF_WRITTEN, 0),
        "chunk_count_differs": 1,
        "ordinal_gaps": 1,
        "chunks_without_embedding": 1,
    }
    assert damaged_differ == 1


def test_sigkill_on_the_last_attempt_fails_the_job_and_its_upload_can_be_sent_again(
    server_env: dict[str, str], database_url: str, servers: list[Server]
) -> None:
    server = Server({**_ingest_env(server_env), "RAGSERVICE_JOB_MAX_ATTEMPTS": "1"})
    servers.append(server)
    server.start()
    documents = generated_documents(DOCUMENTS)
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        killed = upload_and_kill(server, conn, documents)
        server.start()
        with server.client() as client:
            failed = wait_for_job(client, killed.job_id)
            again = client.post("/v1/collections/manuals/documents", json={"documents": documents})
            rerun = wait_for_job(client, again.json()["id"])
        server.stop()
        after, distinct = _stored_documents(conn, killed.collection)
        after_rerun = half_written(conn, killed.collection)
    report(
        "sigkill_on_last_attempt",
        {
            "documents": DOCUMENTS,
            "docs_before_kill": killed.documents,
            "docs_after_rerun": after,
            "half_written_after_kill": sum(killed.half_written.values()),
            "half_written_after_rerun": sum(after_rerun.values()),
            "job": failed["status"],
            "rerun": rerun["status"],
        },
    )
    assert killed.half_written == dict.fromkeys(_HALF_WRITTEN, 0)
    assert failed["status"] == "failed"
    assert "gave up after 1 attempts" in failed["errors"][0]["error"]
    assert rerun["status"] == "done"
    assert rerun["counts"]["unchanged"] == killed.documents
    assert rerun["counts"]["new"] == DOCUMENTS - killed.documents
    assert after_rerun == dict.fromkeys(_HALF_WRITTEN, 0)
    assert (after, distinct) == (DOCUMENTS, DOCUMENTS)


# -- 2. PostgreSQL restarted under a search loop ----------------------------------------------


@pytest.fixture(scope="module")
def restartable_pg() -> Iterator[tuple[str, Standby]]:
    """An embedded PostgreSQL of this module's own (never the session's shared one): its URL
    and a `pg_ctl` handle on it.

    The handle is a `Standby` pointed at the primary's data directory, socket and port: its
    start, stop and readiness wait are those of any node. pgserver stops only the postmaster
    it started (it knows it by process), so the one the restarts left is stopped here, last.
    """
    cluster = DevCluster(Path(tempfile.mkdtemp(prefix="ragservice-faults-pg-")), replicas=0)
    pgdata = cluster.data_dir / "pgdata"
    node = Standby("primary", "primary", pgdata, 0, pgdata)  # until started: stop() needs -D only
    try:
        cluster.start()
        url = cluster.primary_url
        with psycopg.connect(libpq_url(url)) as conn:
            port = int(_scalar(conn, "SELECT current_setting('port')"))
        node = Standby("primary", "primary", pgdata, port, Path(str(make_url(url).query["host"])))
        yield url, node
    finally:
        try:
            if node.port:
                node.start()  # destroy() connects to it (no-op when it runs)
            cluster.destroy(primary=True)
        finally:
            node.stop()  # a postmaster of the test's restarts: pgserver does not know it
            shutil.rmtree(cluster.data_dir, ignore_errors=True)


@dataclass(frozen=True)
class Probe:
    sent: float
    done: float
    status: int  # 0: no HTTP answer at all
    error: str | None  # the `error` field of an error answer
    results: int = 0

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.results > 0


@dataclass
class SearchLoop:
    """Searches one after another on each thread that runs it; bounded in count and time."""

    client: httpx.Client
    max_requests: int = 3000
    max_seconds: float = 90.0
    probes: list[Probe] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        while not self.stopping.is_set() and len(self.probes) < self.max_requests:
            if time.monotonic() > deadline:
                return
            self.probes.append(self._search())
            self.stopping.wait(0.02)

    def _search(self) -> Probe:
        sent = time.monotonic()
        try:
            answer = self.client.post("/v1/search", json=_MANUALS_SEARCH)
            body = answer.json()
        except (httpx.TransportError, ValueError):
            return Probe(sent, time.monotonic(), 0, None)
        if answer.status_code == 200:
            return Probe(sent, time.monotonic(), 200, None, len(body["results"]))
        error = body.get("error") if set(body) >= {"error", "detail", "request_id"} else None
        return Probe(sent, time.monotonic(), answer.status_code, error)

    def first_success_after(self, moment: float, timeout: float = 30.0) -> Probe:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [p for p in list(self.probes) if p.sent >= moment and p.ok]
            if found:
                return min(found, key=lambda p: p.done)
            time.sleep(0.02)
        raise AssertionError(f"no successful search within {timeout:.0f} s of the restart")


def _error_shape(answer: httpx.Response) -> str:
    """The `error` of an answer in the service's error shape (anything else fails the test)."""
    body = answer.json()
    assert set(body) >= {"error", "detail", "request_id"}, body
    return str(body["error"])


@dataclass(frozen=True)
class Restart:
    stopping: float  # pg_ctl stop called
    started: float  # pg_ctl start returned and PostgreSQL accepts connections
    recovered: float  # the first successful search sent after the start answered
    readiness_while_down: int  # the status of GET /readyz during the outage

    def figures(self) -> dict[str, float]:
        return {
            "recovery_after_start_s": round(self.recovered - self.started, 3),
            "stop_to_first_success_s": round(self.recovered - self.stopping, 3),
        }


def restart_postgres(node: Standby, loop: SearchLoop, client: httpx.Client) -> Restart:
    stopping = time.monotonic()
    node.stop("fast")
    readiness = client.get("/readyz").status_code
    time.sleep(OUTAGE_SECONDS)
    node.start()
    started = time.monotonic()
    return Restart(stopping, started, loop.first_success_after(started).done, readiness)


_MANUALS_SEARCH: dict[str, Any] = {"query": "impeller pump", "collections": ["manuals"], "k": 2}


def _load_manuals(client: httpx.Client) -> None:
    assert client.post("/v1/collections", json={"name": "manuals"}).status_code == 201
    documents = [
        {"external_id": "pumps", "text": "Centrifugal pumps move water with an impeller."},
        {"external_id": "valves", "text": "Check valves stop water from flowing backwards."},
        {"external_id": "seals", "text": "A mechanical seal keeps the pump shaft dry."},
    ]
    job = client.post("/v1/collections/manuals/documents", json={"documents": documents})
    assert wait_for_job(client, job.json()["id"])["status"] == "done"


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture(scope="module")
def pg_server(
    restartable_pg: tuple[str, Standby],
    upstream: FakeOpenAI,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Server, dict[str, str]]]:
    """A server on `restartable_pg` and `upstream`, with the `manuals` collection loaded; and
    the headers of a writer key to it. One server for this module's tests: each start costs
    seconds (the model loads)."""
    owner_url = restartable_pg[0]
    engine = create_engine(owner_url)
    try:  # the schema and the service's own login, as an operator sets them up
        migrate.upgrade(engine)
        ensure_service_login(engine)
    finally:
        engine.dispose()
    service_url = make_url(owner_url).set(username=SERVICE_LOGIN, password=None)
    env = {
        **os.environ,
        "RAGSERVICE_DATABASE_URL": service_url.render_as_string(hide_password=False),
        "RAGSERVICE_OWNER_DATABASE_URL": owner_url,
        "RAGSERVICE_DATA_DIR": str(tmp_path_factory.mktemp("faults-data")),
        "RAGSERVICE_JOB_POLL_SECONDS": "0.2",
        "RAGSERVICE_JOB_STALE_SECONDS": "2",
        # No per-key rate limit: the search loop's threads are a load, not an abuse.
        "RAGSERVICE_RATE_LIMIT_PER_SECOND": "0",
        "RAGSERVICE_INFERENCE_URL": upstream.base_url,
        "RAGSERVICE_INFERENCE_READ_TIMEOUT": "1",
        "RAGSERVICE_INFERENCE_CONNECT_TIMEOUT": "1",
        "RAGSERVICE_INFERENCE_MAX_RETRIES": "1",
        "HF_HUB_OFFLINE": "1",
    }
    server = Server(env)
    try:
        server.start()
        headers = {"Authorization": f"Bearer {create_key(env)}"}
        with server.client(headers) as client:
            _load_manuals(client)
        yield server, headers
    finally:
        server.kill()


def test_postgres_restart_under_search_load_recovers_by_itself(
    restartable_pg: tuple[str, Standby], pg_server: tuple[Server, dict[str, str]]
) -> None:
    _, node = restartable_pg
    server, headers = pg_server
    with server.client(headers) as client:
        loop = SearchLoop(server.client(headers))
        threads = [
            threading.Thread(target=loop.run, name=f"search-loop-{n}", daemon=True)
            for n in range(SEARCH_THREADS)
        ]
        for thread in threads:
            thread.start()
        try:
            time.sleep(1.0)
            restarts = [restart_postgres(node, loop, client) for _ in range(RESTARTS)]
            time.sleep(1.0)
        finally:
            loop.stopping.set()
            for thread in threads:
                thread.join(timeout=30)
            loop.client.close()
        assert client.get("/readyz").status_code == 200
    stderr = server.stderr()

    failed = [p for p in loop.probes if not p.ok]
    during = [p for p in failed if any(r.stopping <= p.done <= r.recovered for r in restarts)]
    recoveries = [r.recovered - r.started for r in restarts]
    report(
        "postgres_restart",
        {
            "restarts": RESTARTS,
            "search_threads": SEARCH_THREADS,
            "outage_s": OUTAGE_SECONDS,
            "searches": len(loop.probes),
            "failed_during_outages": len(during),
            "failed_outside_outages": len(failed) - len(during),
            "statuses": sorted({p.status for p in failed}),
            "recovery_after_start_s_median": round(statistics.median(recoveries), 3),
            "each": [r.figures() for r in restarts],
        },
    )
    assert failed, "no search failed: the restart did not reach the service"
    # 503 in the error shape, never a 500, a hang or a 200 without results.
    assert {(p.status, p.error) for p in failed} == {(503, "DatabaseUnavailable")}
    assert during == failed  # nothing failed before a stop or after a recovery
    assert max(recoveries) < RECOVERY_LIMIT_SECONDS
    assert [r.readiness_while_down for r in restarts] == [503] * RESTARTS
    unexpected = re.findall(r"ragservice\.api\.errors: request \S+ failed$", stderr, re.M)
    assert not unexpected, stderr[-4000:]


def test_an_ingest_job_across_a_postgres_restart_is_taken_over_not_failed(
    restartable_pg: tuple[str, Standby], pg_server: tuple[Server, dict[str, str]]
) -> None:
    """Whichever of the job's connections the restart breaks (its writes, its reads, the
    cursor it reads its items through, its claim's), the job is taken over (its claim's lock
    ended with the restart) or goes on, never failed for good (tests/integration/test_jobs.py
    cuts the cursor's connection deterministically)."""
    url, node = restartable_pg
    server, headers = pg_server
    reports = [
        {
            "external_id": f"report-{n:03d}",
            "text": " ".join(f"Report {n} line {w}." for w in range(30)),
        }
        for n in range(JOB_DOCUMENTS)
    ]
    with server.client(headers) as client:
        assert client.post("/v1/collections", json={"name": "reports"}).status_code == 201
        upload = client.post("/v1/collections/reports/documents", json={"documents": reports})
        job_id = upload.json()["id"]
        wait_for_status(client, job_id, "running")
        node.stop("fast")
        node.start()
        job = wait_for_job(client, job_id)
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        collection = _collection(conn, "reports")
        stored, distinct = _stored_documents(conn, collection)
        found = half_written(conn, collection)
    report(
        "job_across_postgres_restart",
        {
            "documents": JOB_DOCUMENTS,
            "status": job["status"],
            "attempts": job["attempts"],
            "docs_after": stored,
            "half_written": sum(found.values()),
        },
    )
    # Attempt 2 when the restart broke one of the job's connections; attempt 1 when it fell
    # between two of the job's transactions (say, while it embedded), whose next connection
    # from the pool was then a fresh one.
    assert job["status"] == "done" and job["attempts"] in (1, 2), job
    assert (stored, distinct) == (JOB_DOCUMENTS, JOB_DOCUMENTS)
    assert found == dict.fromkeys(_HALF_WRITTEN, 0)


def wait_for_status(client: httpx.Client, job_id: str, status: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = client.get(f"/v1/jobs/{job_id}").json()["status"]
        if now == status:
            return
        assert now in ("queued", "running"), f"job {job_id} ended {now} first"
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never became {status}")


# -- 3. the inference upstream hangs, then is gone ---------------------------------------------


def test_upstream_timeout_and_outage_answer_504_and_502_while_search_works(
    upstream: FakeOpenAI, pg_server: tuple[Server, dict[str, str]]
) -> None:
    """Last in the module: it stops the module's upstream."""
    server, headers = pg_server
    with server.client(headers) as client:
        answered = _query(client)
        assert answered.status_code == 200, answered.text
        upstream.enqueue(slow(10))
        hung = _timed(lambda: _query(client))
        upstream.stop()  # nothing listens on its port any more
        gone = _timed(lambda: _query(client))
        hits = client.post("/v1/search", json=_MANUALS_SEARCH)
        streamed = client.post("/v1/query", json={**_QUESTION, "stream": True})
    report(
        "inference_upstream",
        {
            "timeout_status": hung[0].status_code,
            "timeout_answer_s": round(hung[1], 2),
            "unreachable_status": gone[0].status_code,
            "unreachable_answer_s": round(gone[1], 2),
            "search_status": hits.status_code,
        },
    )
    assert (hung[0].status_code, _error_shape(hung[0])) == (504, "UpstreamTimeout")
    assert hung[1] < 5  # the read timeout (1 s), not the upstream's 10 s; a timeout is not retried
    assert (gone[0].status_code, _error_shape(gone[0])) == (502, "Upstream")
    assert "inference upstream" in gone[0].json()["detail"]
    assert hits.status_code == 200
    assert hits.json()["results"][0]["document"]["external_id"] == "pumps"
    # A stream that fails before its first token answers like a whole reply does.
    assert (streamed.status_code, _error_shape(streamed)) == (502, "Upstream")


_QUESTION: dict[str, Any] = {
    "question": "What moves water in a pump?",
    "collections": ["manuals"],
    "cache": False,
}


def _query(client: httpx.Client) -> httpx.Response:
    return client.post("/v1/query", json=_QUESTION)


def _timed(call: Any) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    answer = call()
    return answer, time.monotonic() - started
