"""Helpers for end-to-end tests on an embedded store: processes holding it, its postmaster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import psycopg

from ragservice.db.embedded import HOLDERS_FILE, pgdata_dir

BIN = Path(sys.executable).parent
DEADLINE_S = 120.0  # a bound for a failure, never waited out


def embedded_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a `ragservice` process on the embedded store in `data_dir`."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("RAGSERVICE_DATABASE_URL", "RAGSERVICE_OWNER_DATABASE_URL")
    }
    return {
        **env,
        "RAGSERVICE_DATA_DIR": str(data_dir),
        "RAGSERVICE_AUTH_DISABLED": "true",
        "RAGSERVICE_JOB_POLL_SECONDS": "0.2",
        "RAGSERVICE_QUERY_ENCODER": "torch",  # no ONNX export into each new data folder
        "HF_HUB_OFFLINE": "1",
        "COLUMNS": "200",
        **extra,
    }


def postmasters(data_dir: Path) -> list[psutil.Process]:
    """The PostgreSQL servers running on the store in `data_dir` (the process list's word)."""
    pgdata = str(pgdata_dir(data_dir))
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if process.info["name"] == "postgres" and "-D" in cmdline and pgdata in cmdline:
            found.append(process)
    return found


def stored_documents(data_dir: Path) -> int:
    """Documents in the store (0 while its server or schema is not there yet)."""
    if not postmasters(data_dir):
        return 0
    try:
        with psycopg.connect(
            host=str(pgdata_dir(data_dir)), user="postgres", dbname="ragservice"
        ) as conn:
            row = conn.execute("SELECT count(*) FROM documents").fetchone()
    except psycopg.Error:
        return 0
    return int(row[0]) if row else 0


def holders(data_dir: Path) -> list[int]:
    path = pgdata_dir(data_dir) / HOLDERS_FILE
    return list(json.loads(path.read_text() or "[]")) if path.exists() else []


def wait_for(
    condition: Callable[[], bool],
    what: str,
    process: subprocess.Popen[str],
    deadline_s: float = DEADLINE_S,
) -> None:
    """Poll `condition` until true; fail with `process`'s output if it ends meanwhile."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        if process.poll() is not None:
            _, stderr = process.communicate()
            raise AssertionError(f"exited {process.returncode} waiting for {what}:\n{stderr}")
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what}")
        time.sleep(0.1)


def ragservice(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "ragservice"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )


HOLD_SCRIPT = """
import sys
from pathlib import Path
from ragservice.db.embedded import embedded_database_url
embedded_database_url(Path(sys.argv[1]))
print("held", flush=True)
sys.stdin.read()  # until the test closes it: then a normal exit
"""


def start_holder(data_dir: Path, script: str = HOLD_SCRIPT) -> subprocess.Popen[str]:
    """A plain process holding the embedded store (no model to load) until its stdin closes;
    `script` (run with the data folder as its argument) prints `held` once it holds it."""
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(data_dir)],
        env=embedded_env(data_dir),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if line.strip() != "held":
        _, stderr = process.communicate(timeout=DEADLINE_S)
        raise AssertionError(f"the holder did not start: {stderr}")
    return process
