"""What the integration tests share: a runtime on the test's own database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ragservice.config import Settings
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
