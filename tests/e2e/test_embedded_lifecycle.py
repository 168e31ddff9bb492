"""The embedded PostgreSQL runs while some process holds it, and stops with the last one.

Real `ragservice` processes on an embedded store in a temporary folder: every way a process
ends short of SIGKILL releases its share (the last one out stops PostgreSQL), and after a
SIGKILL the next start notices what was left behind and starts or joins correctly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import psycopg
import pytest

from ragservice.db.embedded import pgdata_dir
from tests.e2e.embedded import (
    BIN,
    DEADLINE_S,
    embedded_env,
    holders,
    postmasters,
    ragservice,
    start_holder,
    stored_documents,
    wait_for,
)
from tests.e2e.test_cli import feed
from tests.e2e.test_server import start_server, wait_until_ready


def start_serve(embedded_dir: Path) -> subprocess.Popen[str]:
    base, process = start_server(embedded_env(embedded_dir))
    wait_until_ready(base, process)
    return process


def end(process: subprocess.Popen[str], signum: int | None = None) -> str:
    """Send `signum` (None: none) and wait for the process to exit; its stderr."""
    if signum is not None:
        process.send_signal(signum)
    _, stderr = process.communicate(timeout=DEADLINE_S)
    return stderr or ""


def kill_all(*processes: subprocess.Popen[str]) -> None:
    """Kill what still runs, with its children (ingest workers hold its stderr pipe)."""
    for process in processes:
        if process.poll() is None:
            for child in psutil.Process(process.pid).children(recursive=True):
                child.kill()
            process.kill()
            process.communicate()


def connect(embedded_dir: Path) -> psycopg.Connection[tuple[object, ...]]:
    pgdata = pgdata_dir(embedded_dir)
    return psycopg.connect(host=str(pgdata), user="postgres", dbname="ragservice", autocommit=True)


# SIGTERM, and SIGHUP (passed on as SIGTERM): the process ends by SIGTERM once cleaned up.
EXIT_STATUS: dict[int, int] = {
    signal.SIGINT: 0,
    signal.SIGTERM: -signal.SIGTERM,
    signal.SIGHUP: -signal.SIGTERM,
}


@pytest.mark.parametrize("signum", list(EXIT_STATUS), ids=lambda s: signal.Signals(s).name)
def test_a_signal_stops_serve_and_its_embedded_server(embedded_dir: Path, signum: int) -> None:
    serve = start_serve(embedded_dir)
    try:
        assert len(postmasters(embedded_dir)) == 1
        assert holders(embedded_dir) == [serve.pid]
        stderr = end(serve, signum)
    finally:
        kill_all(serve)
    assert "Application shutdown complete" in stderr  # uvicorn's graceful shutdown ran
    assert serve.returncode == EXIT_STATUS[signum], stderr
    assert postmasters(embedded_dir) == []
    assert not (pgdata_dir(embedded_dir) / "postmaster.pid").exists()


def test_the_first_holder_out_keeps_it_running_the_last_stops_it(embedded_dir: Path) -> None:
    serve = start_serve(embedded_dir)
    holder = start_holder(embedded_dir)
    try:
        assert holders(embedded_dir) == [serve.pid, holder.pid]
        end(serve, signal.SIGTERM)
        assert serve.returncode == -signal.SIGTERM
        assert holders(embedded_dir) == [holder.pid]
        assert len(postmasters(embedded_dir)) == 1
        with connect(embedded_dir) as conn:
            assert conn.execute("SELECT count(*) FROM alembic_version").fetchone() == (1,)
        holder.communicate(timeout=DEADLINE_S)  # closes its stdin: it exits normally
    finally:
        kill_all(serve, holder)
    assert holder.returncode == 0
    assert postmasters(embedded_dir) == []


def test_after_sigkill_the_next_start_recovers(embedded_dir: Path) -> None:
    """SIGKILL leaves the server running with a gone holder: the next serve joins it and,
    last out, would stop it. With the server killed too and its number now another
    program's, the next start starts a new server."""
    first = start_serve(embedded_dir)
    first.kill()
    first.communicate()
    assert len(postmasters(embedded_dir)) == 1 and holders(embedded_dir) == [first.pid]

    second = start_serve(embedded_dir)
    try:
        assert holders(embedded_dir) == [second.pid]  # the gone one was dropped
        [postmaster] = postmasters(embedded_dir)
        family = [postmaster, *postmaster.children()]
        second.kill()
        second.communicate()
        postmaster.kill()
        _, alive = psutil.wait_procs(family, timeout=DEADLINE_S)
        assert alive == []
    finally:
        kill_all(second)
    stray = subprocess.Popen(["sleep", "600"])  # a live process that is not PostgreSQL
    try:
        pid_file = pgdata_dir(embedded_dir) / "postmaster.pid"
        lines = pid_file.read_text().split("\n")
        pid_file.write_text("\n".join([str(stray.pid), *lines[1:]]))
        third = start_holder(embedded_dir)
        try:
            assert holders(embedded_dir) == [third.pid]
            assert len(postmasters(embedded_dir)) == 1
            third.communicate(timeout=DEADLINE_S)
        finally:
            kill_all(third)
    finally:
        stray.kill()
        stray.wait()
    assert third.returncode == 0
    assert postmasters(embedded_dir) == []


def test_a_command_that_exits_or_fails_releases_it(embedded_dir: Path) -> None:
    env = embedded_env(embedded_dir)
    done = ragservice(["db", "upgrade"], env)
    assert done.returncode == 0, done.stderr
    assert postmasters(embedded_dir) == []
    failed = ragservice(["db", "upgrade", "no_such_revision"], env)  # an uncaught exception
    assert failed.returncode == 1
    assert "no_such_revision" in failed.stderr
    assert postmasters(embedded_dir) == []


def test_sigterm_stops_a_parallel_ingest_after_its_batches_and_releases_it(
    embedded_dir: Path, tmp_path: Path
) -> None:
    """SIGTERM to the command alone (as `docker stop` sends it): the workers stop after their
    batch in flight, the command reports what committed, exits 143 and stops the server."""
    corpus = tmp_path / "docs.jsonl"
    os.mkfifo(corpus)  # no end of input: the run cannot finish before the signal
    # Enough for each worker's first 256-document lookup before the input ends.
    rows = "".join(f'{{"_id": "d{i}", "text": "Note {i} on pumps."}}\n' for i in range(1200))
    args = [str(BIN / "ragservice"), "ingest", str(corpus), "-c", "notes", "--workers", "2"]
    env = embedded_env(embedded_dir, RAGSERVICE_INGEST_BATCH_CHUNKS="8")
    ingest = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True)
    fd = None
    try:
        fd = feed(corpus, rows.encode(), ingest, deadline=time_limit())
        # Three processes load the model first: that can take minutes on a busy machine.
        wait_for(
            lambda: stored_documents(embedded_dir) > 0, "a first batch", ingest, deadline_s=600
        )
        stderr = end(ingest, signal.SIGTERM)
    finally:
        if fd is not None:
            os.close(fd)
        kill_all(ingest)
    assert ingest.returncode == 128 + signal.SIGTERM, stderr
    assert "interrupted by SIGTERM; committed before it" in stderr
    assert postmasters(embedded_dir) == []


def time_limit() -> float:
    return time.monotonic() + DEADLINE_S


SESSION_PROBE = "RAGSERVICE_TEST_SESSION_PROBE"


@pytest.mark.skipif(SESSION_PROBE not in os.environ, reason="run by the test below only")
def test_session_server_probe(pg_admin_url: str) -> None:
    path, ending = os.environ[SESSION_PROBE].rsplit(":", 1)
    Path(path).write_text(pg_admin_url)
    if ending == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(DEADLINE_S)  # the signal ends the session long before


@pytest.mark.parametrize("ending", ["exit", "sigterm"])
def test_a_pytest_session_releases_its_embedded_server(tmp_path: Path, ending: str) -> None:
    probe = tmp_path / "admin-url"
    env = {key: value for key, value in os.environ.items() if key != "RAGSERVICE_TEST_DATABASE_URL"}
    node = f"{Path(__file__).relative_to(Path.cwd())}::test_session_server_probe"
    session = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", node],
        env={**env, SESSION_PROBE: f"{probe}:{ending}"},
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )
    # pytest's statuses: 0 all passed, 2 interrupted.
    assert session.returncode == (0 if ending == "exit" else 2), session.stdout + session.stderr
    socket_dir = probe.read_text().rsplit("host=", 1)[1]
    assert socket_dir.endswith("/pgdata")
    assert postmasters(Path(socket_dir).parent) == []
