"""What the end-to-end tests share: the environment of a real server process."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def server_env(database_url: str, service_url: str, tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "RAGSERVICE_DATABASE_URL": service_url,
        "RAGSERVICE_OWNER_DATABASE_URL": database_url,
        "RAGSERVICE_DATA_DIR": str(tmp_path / "data"),
        "RAGSERVICE_JOB_POLL_SECONDS": "0.2",
        "HF_HUB_OFFLINE": "1",
    }


@pytest.fixture
def embedded_dir() -> Iterator[Path]:
    """A folder for an embedded store, deleted afterwards. Not under pytest's basetemp: another
    pytest session resets that to mode 0700, and PostgreSQL (its own user) would lose it."""
    path = Path(tempfile.mkdtemp(prefix="ragservice-e2e-"))
    yield path / "data"
    shutil.rmtree(path, ignore_errors=True)
