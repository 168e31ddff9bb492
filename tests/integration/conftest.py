"""What the integration tests share: a runtime on the test's own database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ragservice.bootstrap import Runtime, open_runtime
from ragservice.config import Settings
from ragservice.embedding.embedder import SentenceTransformerEmbedder


@pytest.fixture
def runtime(settings: Settings, embedder: SentenceTransformerEmbedder) -> Iterator[Runtime]:
    """The session's model serving the test's database."""
    rt = open_runtime(settings, embedder=embedder)
    yield rt
    rt.close()
