"""What the integration tests share: a runtime on the test's own database."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragservice import runtime as runtimes
from ragservice.config import Settings, get_settings
from ragservice.db import tenancy
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from ragservice.runtime import Runtime, open_runtime


@pytest.fixture(autouse=True)
def across_tenants(request: pytest.FixtureRequest) -> Iterator[None]:
    """Integration tests seed and inspect rows of several tenants from the test's own thread,
    so that thread works across tenants, explicitly. What the code under test runs in threads
    of its own (job workers, background loops) starts with no tenant, as in production.
    Tests marked `default_tenancy` start with no tenant in their own thread too."""
    if request.node.get_closest_marker("default_tenancy"):
        yield
        return
    with tenancy.as_system():
        yield


@pytest.fixture
def runtime(settings: Settings, embedder: SentenceTransformerEmbedder) -> Iterator[Runtime]:
    """The session's model serving the test's database."""
    rt = open_runtime(settings, embedder=embedder)
    yield rt
    rt.close()


@pytest.fixture
def cli(
    database_url: str,
    tmp_path: Path,
    embedder: SentenceTransformerEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[CliRunner]:
    """The `ragservice` command in this process, on the session's database and model."""
    monkeypatch.setenv("RAGSERVICE_DATABASE_URL", database_url)
    monkeypatch.setenv("RAGSERVICE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("COLUMNS", "200")
    shared = functools.partial(runtimes.open_runtime, embedder=embedder)
    monkeypatch.setattr(runtimes, "open_runtime", shared)
    get_settings.cache_clear()
    yield CliRunner()
    get_settings.cache_clear()
