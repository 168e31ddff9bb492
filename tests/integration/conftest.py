"""What the integration tests share: a runtime on the test's own database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ragservice.config import Settings
from ragservice.embedding import SentenceTransformerEmbedder
from ragservice.runtime import Runtime, open_runtime


@pytest.fixture
def runtime(settings: Settings, embedder: SentenceTransformerEmbedder) -> Iterator[Runtime]:
    """The session's model serving the test's database."""
    rt = open_runtime(settings, embedder=embedder)
    yield rt
    rt.close()
