"""`ragservice backup` of a live embedded store while an ingest writes, and `restore`.

The restored store must be the source as of one moment: a prefix of the ingest, whole
documents only (each with all its chunks and their vectors, equal to the source's), and a
server started on it finds what the source's data gives for a search.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from ragservice.db.embedded import acquire_embedded_server, pgdata_dir, release_embedded_server
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from tests.e2e.embedded import (
    BIN,
    DEADLINE_S,
    embedded_env,
    postmasters,
    ragservice,
    start_holder,
    stored_documents,
    wait_for,
)
from tests.e2e.test_cli import feed
from tests.e2e.test_server import start_server, wait_until_ready

TOPICS = ["pumps", "valves", "turbines", "boilers", "compressors", "gearboxes", "bearings"]
DOCUMENTS = 700
FED_FIRST = 600  # before the backup; the rest after it
QUERIES = ["centrifugal pump impeller", "steam boiler pressure", "ball bearing wear"]


def deadline() -> float:
    return time.monotonic() + 600  # a bound for a failure, never waited out


def rows() -> list[str]:
    return [
        json.dumps({"_id": f"d{i:03d}", "text": f"Field note {i} on {TOPICS[i % 7]}, unit {i}."})
        + "\n"
        for i in range(DOCUMENTS)
    ]


@contextmanager
def held(data_dir: Path) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
    """A superuser connection to the embedded store (started if need be, released after)."""
    acquire_embedded_server(data_dir)
    try:
        with psycopg.connect(
            host=str(pgdata_dir(data_dir)), user="postgres", dbname="ragservice", autocommit=True
        ) as conn:
            yield conn
    finally:
        release_embedded_server(data_dir)


Snapshot = dict[str, tuple[Any, ...]]


def snapshot(conn: psycopg.Connection[tuple[Any, ...]]) -> Snapshot:
    """Every document: its hash and chunk count, and each chunk with its vector."""
    found: dict[str, list[Any]] = {}
    for external_id, doc_hash, chunk_count, *chunk in conn.execute(
        "SELECT d.external_id, d.content_hash, d.chunk_count,"
        " c.id, c.ordinal, c.text, c.content_hash, e.embedding::text"
        " FROM documents d LEFT JOIN chunks c ON c.document_id = d.id"
        " LEFT JOIN chunk_embeddings e ON e.chunk_id = c.id ORDER BY 1, c.ordinal"
    ):
        found.setdefault(external_id, [doc_hash, chunk_count, []])[2].append(tuple(chunk))
    return {key: (value[0], value[1], tuple(value[2])) for key, value in found.items()}


def exact_top(
    conn: psycopg.Connection[tuple[Any, ...]], vector: str, documents: list[str]
) -> list[str]:
    """The source's five nearest chunks among `documents`, by an exact scan."""
    conn.execute("SET enable_indexscan = off")
    return [
        str(row[0])
        for row in conn.execute(
            "SELECT c.id FROM chunk_embeddings e JOIN chunks c ON c.id = e.chunk_id"
            " JOIN documents d ON d.id = c.document_id WHERE d.external_id = ANY(%s)"
            " ORDER BY e.embedding <=> %s::vector, c.id LIMIT 5",
            (documents, vector),
        )
    ]


def write_all(fd: int, data: bytes, process: subprocess.Popen[str]) -> None:
    """Write `data` into the ingest's pipe (non-blocking) as fast as it reads."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            assert process.poll() is None, "the ingest ended early"
            time.sleep(0.05)


def test_backup_of_a_live_store_restores_a_consistent_prefix(
    embedded_dir: Path, tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    source, target, backup = embedded_dir, embedded_dir.parent / "restored", tmp_path / "bk"
    corpus = tmp_path / "notes.jsonl"
    os.mkfifo(corpus)
    all_rows = rows()
    env = embedded_env(source, RAGSERVICE_INGEST_BATCH_CHUNKS="2")
    args = [str(BIN / "ragservice"), "ingest", str(corpus), "-c", "notes"]
    ingest = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True)
    fd = None
    try:
        # The pipeline checks stored hashes 256 documents at a time: the first 512 are written
        # batch after batch while the backup runs, the rest wait for the end of the input.
        fd = feed(corpus, "".join(all_rows[:FED_FIRST]).encode(), ingest, deadline())
        wait_for(lambda: stored_documents(source) > 0, "a first batch", ingest, deadline_s=600)
        before = stored_documents(source)
        taken = ragservice(["backup", str(backup), "--json"], env)
        after = stored_documents(source)
        write_all(fd, "".join(all_rows[FED_FIRST:]).encode(), ingest)
        os.close(fd)
        fd = None
        _, ingest_stderr = ingest.communicate(timeout=DEADLINE_S)
    finally:
        if fd is not None:
            os.close(fd)
        if ingest.poll() is None:
            ingest.kill()
            ingest.communicate()
    assert taken.returncode == 0, taken.stderr
    assert ingest.returncode == 0, ingest_stderr
    summary = json.loads(taken.stdout)
    assert summary["path"] == str(backup) and summary["bytes"] > 0
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []
    assert postmasters(source) == []  # the ingest, last out, stopped it

    restored = ragservice(["restore", str(backup), "--json"], embedded_env(target))
    assert restored.returncode == 0, restored.stderr
    assert json.loads(restored.stdout)["replaced"] is False

    with held(source) as conn:
        source_docs = snapshot(conn)
    with held(target) as conn:
        restored_docs = snapshot(conn)
    assert len(source_docs) == DOCUMENTS
    assert before < after  # the ingest kept writing while the backup ran
    # A prefix of the ingest, as of a moment during the backup.
    assert before <= len(restored_docs) <= after
    assert sorted(restored_docs) == [f"d{i:03d}" for i in range(len(restored_docs))]
    for external_id, (doc_hash, chunk_count, chunks) in restored_docs.items():
        assert (doc_hash, chunk_count, chunks) == source_docs[external_id]
        assert len(chunks) == chunk_count and all(chunk[-1] for chunk in chunks)

    base, serve = start_server(embedded_env(target))
    try:
        wait_until_ready(base, serve)
        with held(source) as conn:
            expected = {
                query: exact_top(
                    conn, str(embedder.embed([query])[0].tolist()), list(restored_docs)
                )
                for query in QUERIES
            }
        for query in QUERIES:
            answer = httpx.post(
                f"{base}/v1/search",
                json={"query": query, "collections": ["notes"], "mode": "dense", "k": 5},
                timeout=60,
            )
            assert answer.status_code == 200, answer.text
            assert [hit["chunk_id"] for hit in answer.json()["results"]] == expected[query]
        serve.send_signal(signal.SIGTERM)
        serve.communicate(timeout=DEADLINE_S)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.communicate()
    assert postmasters(target) == []


def test_restore_refuses_to_overwrite_and_never_leaves_half_a_store(
    embedded_dir: Path, tmp_path: Path
) -> None:
    source, target, backup = embedded_dir, embedded_dir.parent / "restored", tmp_path / "bk"
    assert ragservice(["db", "upgrade"], embedded_env(source)).returncode == 0
    first = ragservice(["backup", str(backup)], embedded_env(source))
    assert first.returncode == 0, first.stderr
    assert "written to" in first.stderr
    again = ragservice(["backup", str(backup)], embedded_env(source))
    assert again.returncode == 1 and "already exists" in again.stderr

    env = embedded_env(target)
    assert ragservice(["restore", str(backup)], env).returncode == 0
    with held(target) as conn:
        conn.execute("CREATE DATABASE written_after_the_restore")
    refused = ragservice(["restore", str(backup)], env)
    assert refused.returncode == 1 and "pass --force" in refused.stderr

    holder = start_holder(target)
    try:
        in_use = ragservice(["restore", str(backup), "--force"], env)
    finally:
        holder.communicate(timeout=DEADLINE_S)
    assert in_use.returncode == 1 and "in use" in in_use.stderr

    damaged = tmp_path / "damaged"
    subprocess.run(["cp", "-a", str(backup), str(damaged)], check=True)
    with (damaged / "global" / "pg_control").open("ab") as file:
        file.write(b"x")
    broken = ragservice(["restore", str(damaged), "--force"], env)
    assert broken.returncode == 1 and "damaged" in broken.stderr
    with held(target) as conn:  # all three refusals left the store as it was
        assert databases(conn) >= {"ragservice", "written_after_the_restore"}

    forced = ragservice(["restore", str(backup), "--force"], env)
    assert forced.returncode == 0, forced.stderr
    with held(target) as conn:
        assert "written_after_the_restore" not in databases(conn)
    assert sorted(p.name for p in target.iterdir() if p.name != "onnx") == ["pgdata"]


def databases(conn: psycopg.Connection[tuple[Any, ...]]) -> set[str]:
    return {str(row[0]) for row in conn.execute("SELECT datname FROM pg_database")}


@pytest.mark.parametrize("command", ["backup", "restore"])
def test_backup_and_restore_are_for_the_embedded_store(tmp_path: Path, command: str) -> None:
    env = {**embedded_env(tmp_path / "data"), "RAGSERVICE_DATABASE_URL": "postgresql://db/x"}
    result = ragservice([command, str(tmp_path)], env)
    assert result.returncode == 1
    assert "pg_dump or pg_basebackup" in result.stderr
