"""The real server process, started as `ragservice serve`, answering over HTTP."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def server(server_env: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    base, process = start_server(server_env)
    try:
        wait_until_ready(base, process)
        yield base, process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=30)


def start_server(env: dict[str, str]) -> tuple[str, subprocess.Popen[str]]:
    """`ragservice serve` on a free loopback port; stderr is kept for the shutdown checks."""
    port = free_port()
    process = subprocess.Popen(
        [str(BIN / "ragservice"), "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    return f"http://127.0.0.1:{port}", process


def wait_until_ready(base: str, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    stderr = process.stderr.read() if process.stderr and process.poll() is not None else ""
    raise AssertionError(f"server never became ready: {stderr}")


def stop(process: subprocess.Popen[str]) -> str:
    process.terminate()
    _, stderr = process.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises SIGTERM so the exit status tells of it.
    assert process.returncode in (0, -signal.SIGTERM), stderr
    assert "Application shutdown complete" in stderr
    return stderr


def create_key(env: dict[str, str]) -> str:
    made = subprocess.run(
        [str(BIN / "ragservice"), "keys", "create", "--tenant", "e2e", "--role", "writer"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    secret = made.stdout.strip()
    assert secret.startswith("rsk_"), made.stderr
    assert "shown only this once" in made.stderr
    return secret


def wait_for_job(client: httpx.Client, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("done", "failed"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} never finished")


def test_upload_wait_search_and_shut_down(
    server_env: dict[str, str], server: tuple[str, subprocess.Popen[str]]
) -> None:
    base, process = server
    secret = create_key(server_env)
    headers = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
        assert httpx.get(f"{base}/v1/collections").status_code == 401
        assert client.post("/v1/collections", json={"name": "manuals"}).status_code == 201
        files = [
            ("files", ("pumps.md", b"# Pumps\n\nCentrifugal pumps move water with an impeller.")),
            ("files", ("valves.txt", b"Check valves stop water from flowing backwards.")),
        ]
        upload = client.post("/v1/collections/manuals/documents/files", files=files)
        assert upload.status_code == 202, upload.text
        job = wait_for_job(client, upload.json()["id"])
        assert (job["status"], job["counts"]["new"]) == ("done", 2)
        hits = client.post("/v1/search", json={"query": "impeller pump", "k": 2}).json()
        assert hits["results"][0]["document"]["external_id"] == "pumps.md"
        assert "impeller" in hits["results"][0]["text"]
    stop(process)


def test_auth_cannot_be_off_on_a_public_bind(server_env: dict[str, str]) -> None:
    env = {**server_env, "RAGSERVICE_AUTH_DISABLED": "1"}
    refused = subprocess.run(
        [str(BIN / "ragservice"), "serve", "--host", "0.0.0.0", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2
    assert "loopback" in refused.stderr


def test_cli_against_the_server(
    server_env: dict[str, str], server: tuple[str, subprocess.Popen[str]]
) -> None:
    """`ragservice search|ask|jobs --url`: the server's answers, the key's tenant, its errors."""
    base, _ = server
    secret = create_key(server_env)
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {secret}"}) as client:
        assert client.post("/v1/collections", json={"name": "manuals"}).status_code == 201
        files = [("files", ("pumps.md", b"# Pumps\n\nCentrifugal pumps move water."))]
        upload = client.post("/v1/collections/manuals/documents/files", files=files).json()
        assert wait_for_job(client, upload["id"])["status"] == "done"

    def cli(*args: str, key: str | None = secret) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in server_env.items() if k != "RAGSERVICE_DATABASE_URL"}
        env = {**env, "COLUMNS": "200", **({"RAGSERVICE_API_KEY": key} if key else {})}
        command = [str(BIN / "ragservice"), *args, "--url", base]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    found = cli("search", "pumps", "-k", "1", "--json")
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["results"][0]["document"]["external_id"] == "pumps.md"
    asked = cli("ask", "What moves water?", "-c", "manuals", "-k", "1")
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout.endswith("\n\n[1] Pumps (pumps.md)\n")
    (job,) = json.loads(cli("jobs", "list", "--json").stdout)
    assert (job["id"], job["status"]) == (upload["id"], "done")
    retried = cli("jobs", "retry", upload["id"])
    assert retried.returncode == 1 and "only a failed job can be retried" in retried.stderr
    anonymous = cli("jobs", "list", key=None)
    assert anonymous.returncode == 1 and "missing API key" in anonymous.stderr
