"""The CLI through its real entry points, as separate processes against a real PostgreSQL."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from ragservice.db import migrate

BIN = Path(sys.executable).parent


def run(args: list[str], database_url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "RAGSERVICE_DATABASE_URL": database_url,
        "RAGSERVICE_DATA_DIR": str(tmp_path / "unused"),
        "HF_HUB_OFFLINE": "1",
        "COLUMNS": "200",
    }
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, check=False)


def libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    (root / "notes").mkdir(parents=True)
    (root / "intro.md").write_text("# Intro\n\nVector search finds similar passages.\n")
    (root / "notes" / "a.txt").write_text("Hybrid retrieval mixes dense and sparse signals.")
    (root / "notes" / "skip.log").write_text("not a supported type")
    return root


def test_ingest_cli_end_to_end(database_url: str, corpus: Path, tmp_path: Path) -> None:
    first = run(
        [str(BIN / "ragservice"), "ingest", str(corpus), "--collection", "docs"],
        database_url,
        tmp_path,
    )
    assert first.returncode == 0, first.stderr
    assert "new" in first.stderr and "chunks written 2" in first.stderr

    with psycopg.connect(libpq(database_url)) as conn:
        rows = conn.execute("SELECT external_id, version FROM documents ORDER BY 1").fetchall()
        job = conn.execute("SELECT status, counts->>'new' FROM ingest_jobs").fetchall()
    assert rows == [("intro.md", 1), ("notes/a.txt", 1)]
    assert job == [("done", "2")]

    again = run(
        [sys.executable, "-m", "ingest", str(corpus), "--collection", "docs"],
        database_url,
        tmp_path,
    )
    assert again.returncode == 0, again.stderr
    assert "chunks written 0" in again.stderr
    assert "unchanged" in again.stderr


def test_ingest_cli_with_worker_processes(database_url: str, corpus: Path, tmp_path: Path) -> None:
    args = [sys.executable, "-m", "ingest", str(corpus), "-c", "docs", "--workers", "2"]
    first = run(args, database_url, tmp_path)
    assert first.returncode == 0, first.stderr
    assert "chunks written 2" in first.stderr

    with psycopg.connect(libpq(database_url)) as conn:
        rows = conn.execute("SELECT external_id, version FROM documents ORDER BY 1").fetchall()
        job = conn.execute("SELECT status, counts->>'new' FROM ingest_jobs").fetchall()
    assert rows == [("intro.md", 1), ("notes/a.txt", 1)]
    assert job == [("done", "2")]


def test_ingest_cli_reports_failures_with_nonzero_exit(
    database_url: str, corpus: Path, tmp_path: Path
) -> None:
    (corpus / "broken.pdf").write_bytes(b"%PDF-1.4\n1 0 obj << /Type /Catalog")
    result = run(
        [str(BIN / "ragservice"), "ingest", str(corpus), "-c", "docs"], database_url, tmp_path
    )
    assert result.returncode == 1
    assert "broken.pdf" in result.stderr
    with psycopg.connect(libpq(database_url)) as conn:
        count = conn.execute("SELECT count(*) FROM documents").fetchone()
        job = conn.execute("SELECT status, jsonb_array_length(errors) FROM ingest_jobs").fetchone()
    assert count == (2,)  # the good files still went in
    assert job == ("failed", 1)


def test_ingest_cli_dry_run_and_bad_arguments(
    database_url: str, corpus: Path, tmp_path: Path
) -> None:
    dry = run(
        [str(BIN / "ragservice"), "ingest", str(corpus), "-c", "docs", "--dry-run"],
        database_url,
        tmp_path,
    )
    assert dry.returncode == 0, dry.stderr
    assert "dry run" in dry.stderr
    with psycopg.connect(libpq(database_url)) as conn:
        assert conn.execute("SELECT count(*) FROM documents").fetchone() == (0,)

    missing = run(
        [str(BIN / "ragservice"), "ingest", str(tmp_path / "nope"), "-c", "docs"],
        database_url,
        tmp_path,
    )
    assert missing.returncode == 2
    assert "does not exist" in missing.stderr


def test_ingest_cli_imports_parquet_vectors_without_loading_the_model(
    database_url: str, corpus: Path, tmp_path: Path
) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    ragservice = str(BIN / "ragservice")
    first = run([ragservice, "ingest", str(corpus), "-c", "docs"], database_url, tmp_path)
    assert first.returncode == 0, first.stderr
    assert "loaded embedding model" in first.stderr  # registered (and loaded) once
    vectors = np.random.default_rng(0).standard_normal((3, 384)).astype(np.float32)
    path = tmp_path / "chunks.parquet"
    embedding = pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 384)
    table = {"id": ["v1", "v1", "v2"], "text": ["a b", "c", "d e f"], "embedding": embedding}
    pq.write_table(pa.table(table), path)
    imported = run([ragservice, "ingest", str(path), "-c", "docs"], database_url, tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert "imported with vectors 3" in imported.stderr
    assert "loaded embedding model" not in imported.stderr
    again = run([ragservice, "ingest", str(path), "-c", "docs"], database_url, tmp_path)
    assert again.returncode == 0 and "chunks written 0" in again.stderr, again.stderr
    wrong = run(
        [ragservice, "ingest", str(path), "-c", "docs", "--model", "no-such-model"],
        database_url,
        tmp_path,
    )
    assert wrong.returncode == 1 and "no embedding model 'no-such-model'" in wrong.stderr


def test_db_upgrade_command(database_url: str, tmp_path: Path) -> None:
    result = run([str(BIN / "ragservice"), "db", "upgrade"], database_url, tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"schema at revision {migrate.head_revision()}" in result.stderr


def running(process: subprocess.Popen[str], deadline: float, waiting_for: str) -> None:
    """Fail with the process's output if it ended, or with `waiting_for` past `deadline`."""
    if process.poll() is not None:
        _, stderr = process.communicate()
        pytest.fail(f"exited {process.returncode} while waiting for {waiting_for}:\n{stderr}")
    if time.monotonic() > deadline:
        pytest.fail(f"still waiting for {waiting_for}")


def feed(fifo: Path, data: bytes, process: subprocess.Popen[str], deadline: float) -> int:
    """Write `data` into the named pipe `fifo` once `process` opens it, never blocking.

    Returns the descriptor of the pipe's end: closing it is the end of the input.
    """
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: nobody reads it yet
                raise
        running(process, deadline, f"the ingest to open {fifo.name}")
        time.sleep(0.05)
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:  # the pipe is full until the ingest reads on
            running(process, deadline, f"the ingest to read {fifo.name}")
            time.sleep(0.05)
    return fd


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-worker-processes"])
def test_ctrl_c_mid_ingest_leaves_whole_documents_and_a_rerun_finishes(
    database_url: str, tmp_path: Path, workers: int
) -> None:
    """Ctrl-C once some batches committed: they stay, whole; exit 130; a rerun adds the rest.
    With worker processes the Ctrl-C reaches the command only, which stops the workers.

    The ingest reads a named pipe that gets every row but the last and no end of input, so it
    cannot finish before the Ctrl-C however busy the machine: the test waits for a state
    (a first batch committed), not for a time, and "some but not all" is certain.
    """
    rows = [
        f'{{"_id": "doc{i}", "title": "Title {i}", "text": "Finding number {i} about cells. '
        + "Proteins fold in many ways. " * 6
        + '"}'
        for i in range(400)
    ]
    corpus = tmp_path / "many.jsonl"
    os.mkfifo(corpus)
    env = {
        **os.environ,
        "RAGSERVICE_DATABASE_URL": database_url,
        "RAGSERVICE_INGEST_BATCH_CHUNKS": "16",
        "HF_HUB_OFFLINE": "1",
        "COLUMNS": "200",
    }
    args = [str(BIN / "ragservice"), "ingest", str(corpus), "-c", "big", "--workers", str(workers)]
    process = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True)
    fd = None
    try:
        deadline = time.monotonic() + 300  # a bound for a failure, never waited out
        fd = feed(corpus, "".join(f"{row}\n" for row in rows[:-1]).encode(), process, deadline)
        with psycopg.connect(libpq(database_url), autocommit=True) as conn:
            while conn.execute("SELECT count(*) FROM documents").fetchone() == (0,):
                running(process, deadline, "a first batch to commit")
                time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        if fd is not None:
            os.close(fd)
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, stderr

    with psycopg.connect(libpq(database_url)) as conn:
        stored_after, chunk_total, orphans, unembedded = conn.execute(
            "SELECT (SELECT count(*) FROM documents), (SELECT sum(chunk_count) FROM documents),"
            " (SELECT count(*) FROM chunks c WHERE NOT EXISTS"
            "   (SELECT 1 FROM documents d WHERE d.id = c.document_id)),"
            " (SELECT count(*) FROM chunks c WHERE NOT EXISTS"
            "   (SELECT 1 FROM chunk_embeddings e WHERE e.chunk_id = c.id))"
        ).fetchone()
        assert 0 < stored_after < 400
        assert conn.execute("SELECT count(*) FROM chunks").fetchone() == (chunk_total,)
        assert (orphans, unembedded) == (0, 0)
        job = conn.execute("SELECT status, (counts->>'new')::int FROM ingest_jobs").fetchone()
    assert job is not None and job[0] == "failed"
    assert 0 < job[1] <= stored_after  # the batches that committed before Ctrl-C
    assert f"committed before it: {job[1]} new and 0 updated documents" in stderr

    corpus.unlink()
    corpus.write_text("".join(f"{row}\n" for row in rows))  # the same name: the same metadata
    rerun = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert rerun.returncode == 0, rerun.stderr
    with psycopg.connect(libpq(database_url)) as conn:
        assert conn.execute("SELECT count(*), max(version) FROM documents").fetchone() == (400, 1)
        finished = conn.execute(
            "SELECT (counts->>'new')::int, (counts->>'unchanged')::int FROM ingest_jobs"
            " WHERE status = 'done'"
        ).fetchone()
    assert finished == (400 - stored_after, stored_after)


def test_ctrl_c_after_the_last_batch_still_exits_130(
    database_url: str, corpus: Path, tmp_path: Path
) -> None:
    """A Ctrl-C once every batch committed cuts nothing short, but the user pressed it."""
    # The real command, which sends itself SIGINT when it closes the runtime: after the
    # pipeline returned and the job was recorded.
    script = textwrap.dedent(
        """
        import os, signal
        from ragservice.runtime import Runtime
        from ragservice.cli.ingest import main

        close = Runtime.close

        def ctrl_c_then_close(self):
            os.kill(os.getpid(), signal.SIGINT)
            close(self)

        Runtime.close = ctrl_c_then_close
        main()
        """
    )
    result = run([sys.executable, "-c", script, str(corpus), "-c", "docs"], database_url, tmp_path)
    assert result.returncode == 130, result.stderr
    assert "Ctrl-C after the last batch had committed; nothing was cut short" in result.stderr
    assert "(committed: 2 new and 0 updated documents (2 chunks))" in result.stderr
    with psycopg.connect(libpq(database_url)) as conn:
        assert conn.execute("SELECT count(*) FROM documents").fetchone() == (2,)
        job = conn.execute("SELECT status, (counts->>'new')::int FROM ingest_jobs").fetchone()
    assert job == ("done", 2)


def test_dev_cluster_runs_streaming_standbys_until_interrupted() -> None:
    """`ragservice dev-cluster`: a real standby that replays the primary, removed on Ctrl-C."""
    import tempfile

    data_dir = Path(tempfile.mkdtemp(prefix="rs-devc-"))  # short: Unix socket paths are limited
    env = {
        **os.environ,
        "RAGSERVICE_DATA_DIR": str(data_dir),
        "HF_HUB_OFFLINE": "1",
    }
    env.pop("RAGSERVICE_DATABASE_URL", None)
    process = subprocess.Popen(
        [str(BIN / "ragservice"), "dev-cluster", "--replicas", "1", "--regions", "eu"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        printed = [process.stdout.readline(), process.stdout.readline()]
        assert printed[0].strip() == "RAGSERVICE_REGION=eu", printed
        region, _, url = printed[1].strip().removeprefix("RAGSERVICE_REPLICAS=").partition("=")
        assert region == "eu"
        with psycopg.connect(libpq(url)) as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        assert (data_dir / "replicas" / "eu-1" / "standby.signal").exists()
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "standbys stopped and removed" in stderr
    assert not (data_dir / "replicas" / "eu-1").exists()
    shutil.rmtree(data_dir, ignore_errors=True)  # the primary stopped with its last process


def test_version_and_python_dash_m(tmp_path: Path) -> None:
    from importlib.metadata import version

    for args in (
        [str(BIN / "ragservice"), "--version"],
        [sys.executable, "-m", "ragservice", "--version"],
    ):
        shown = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
        assert (shown.returncode, shown.stdout) == (0, f"ragservice {version('ragservice')}\n")
    usage = subprocess.run(
        [sys.executable, "-m", "ragservice", "tenants", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert usage.returncode == 0 and "Usage: ragservice tenants" in usage.stdout


def test_search_then_ask_prints_the_answer_as_it_is_generated(
    database_url: str, corpus: Path, tmp_path: Path
) -> None:
    """`ragservice search` and `ask` on the local store. The upstream holds the answer after
    its first words until the test has read them on the command's stdout: the command printed
    them before the answer was whole."""
    import threading

    from tests.upstream import FakeOpenAI, ok

    ragservice = str(BIN / "ragservice")
    ingested = run([ragservice, "ingest", str(corpus), "-c", "docs"], database_url, tmp_path)
    assert ingested.returncode == 0, ingested.stderr
    found = run(
        [ragservice, "search", "dense and sparse", "-k", "1", "--json"], database_url, tmp_path
    )
    assert found.returncode == 0, found.stderr
    (hit,) = json.loads(found.stdout)["results"]  # nothing else on stdout
    assert (hit["document"]["external_id"], hit["collection"]) == ("notes/a.txt", "docs")

    release = threading.Event()
    with FakeOpenAI() as upstream:
        upstream.enqueue(ok("Hybrid retrieval mixes signals [1].", hold=release, hold_after=2))
        env = {
            **os.environ,
            "RAGSERVICE_DATABASE_URL": database_url,
            "RAGSERVICE_INFERENCE_URL": upstream.base_url,
            "RAGSERVICE_CACHE_ENABLED": "false",
            "HF_HUB_OFFLINE": "1",
        }
        args = [ragservice, "ask", "What does hybrid retrieval mix?", "-c", "docs", "-k", "1"]
        process = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert process.stdout is not None
            shown = b""
            deadline = time.monotonic() + 120
            while b"Hybrid retrieval " not in shown:
                piece = os.read(process.stdout.fileno(), 1024)
                if not piece:
                    running(process, deadline, "the first words")  # type: ignore[arg-type]
                shown += piece
            assert process.poll() is None  # still waiting for the rest of the answer
            release.set()
            rest, stderr = process.communicate(timeout=120)
        finally:
            release.set()
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 0, stderr
    assert (shown + rest).decode() == "Hybrid retrieval mixes signals [1].\n\n[1] notes/a.txt\n"
