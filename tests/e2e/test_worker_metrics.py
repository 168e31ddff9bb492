"""`ragservice worker --metrics-port` as a real process: it runs a queued job and its metrics
port shows the job counted, the queue emptied and the process collectors."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
import uuid

import httpx

from ragservice import store
from ragservice.config import DEFAULT_TENANT_ID, Settings
from ragservice.db import open_database, tenancy
from tests.e2e.test_server import BIN, free_port

DONE = 'ragservice_jobs_finished_total{kind="upload",outcome="done"} 1.0'


def test_worker_serves_its_metrics(server_env: dict[str, str]) -> None:
    enqueue_one_job(server_env)
    port = free_port()
    worker = subprocess.Popen(
        [str(BIN / "ragservice"), "worker", "--metrics-port", str(port)],
        env=server_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        text = scrape_until(f"http://127.0.0.1:{port}/metrics", DONE, worker)
        assert 'ragservice_job_documents_total{result="new"} 2.0' in text
        assert "ragservice_jobs_running 0.0" in text
        assert "process_resident_memory_bytes" in text
        assert "python_gc_collections_total" in text
        assert "ragservice_http_requests_total" not in text  # a worker serves no API
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=60)
        assert worker.returncode == 0, stderr
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate(timeout=30)


def enqueue_one_job(env: dict[str, str]) -> None:
    settings = Settings(
        database_url=env["RAGSERVICE_DATABASE_URL"],
        owner_database_url=env["RAGSERVICE_OWNER_DATABASE_URL"],
        data_dir=env["RAGSERVICE_DATA_DIR"],
    )
    db = open_database(settings)  # migrates, as the worker would
    try:
        tenant_id = uuid.UUID(DEFAULT_TENANT_ID)
        with tenancy.as_tenant(tenant_id), db.write() as session:
            collection_id = store.collections.ensure_collection(session, tenant_id, "notes")
            items = [
                store.jobs.JobItem(kind="text", name=name, title=None, body=body)
                for name, body in [("a", b"Pumps move water."), ("b", b"Valves stop it.")]
            ]
            store.jobs.enqueue_job(
                session,
                tenant_id=tenant_id,
                collection_id=collection_id,
                kind="upload",
                params={"items": 2},
                items=items,
            )
    finally:
        db.dispose()


def scrape_until(url: str, expected: str, process: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + 180
    text = ""
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(httpx.TransportError):
            text = httpx.get(url, timeout=5).text
        if expected in text:
            return text
        time.sleep(0.2)
    _, stderr = process.communicate(timeout=30) if process.poll() is not None else ("", "")
    raise AssertionError(f"{expected!r} not scraped; worker stderr: {stderr}; last: {text[-500:]}")
