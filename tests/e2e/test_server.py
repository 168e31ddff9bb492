"""The real server process, started as `ragservice serve`, answering over HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_serve_starts_migrates_and_becomes_ready(database_url: str, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "RAGSERVICE_DATABASE_URL": database_url, "HF_HUB_OFFLINE": "1"}
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "ragservice"), "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and server.poll() is None:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.5)
        assert ready is not None, server.stderr.read() if server.stderr else "no output"
        assert ready.status_code == 200
        assert ready.json()["ready"] is True
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises SIGTERM so the exit status tells of it.
    assert server.returncode in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in stderr
