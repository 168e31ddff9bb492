"""Opens what a process of the service needs: the database, the embedder and its model row."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from ragservice import store
from ragservice.chunking import ChunkingOptions
from ragservice.config import DEFAULT_TENANT_ID, Settings
from ragservice.db import Database, open_database
from ragservice.embedding import SentenceTransformerEmbedder, make_embedder
from ragservice.errors import ConfigurationError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    db: Database
    embedder: SentenceTransformerEmbedder
    model_id: int

    @property
    def default_tenant_id(self) -> uuid.UUID:
        return uuid.UUID(DEFAULT_TENANT_ID)

    def chunking_options(self) -> ChunkingOptions:
        return chunking_options(self.settings, self.embedder.max_tokens)

    def close(self) -> None:
        self.db.dispose()


def open_runtime(
    settings: Settings, *, embedder: SentenceTransformerEmbedder | None = None
) -> Runtime:
    """Start or join PostgreSQL, migrate, load the embedding model once and register it.

    Pass an `embedder` that is already loaded to share one model between runtimes (tests).
    """
    db = open_database(settings)
    if embedder is None:
        embedder = make_embedder(settings)
        embedder.warm_up()
    with db.write() as session:
        model = store.register_embedding_model(
            session,
            name=embedder.name,
            dimension=embedder.dimension,
            path=embedder.path,
            hnsw_m=settings.hnsw_m,
            hnsw_ef_construction=settings.hnsw_ef_construction,
        )
    if not model.active:
        log.warning("embedding model %s is registered but another model is active", embedder.name)
    return Runtime(settings=settings, db=db, embedder=embedder, model_id=model.id)


def chunking_options(settings: Settings, model_max_tokens: int) -> ChunkingOptions:
    """Chunk size from the settings, never above what the embedding model reads."""
    size = settings.chunk_max_tokens or model_max_tokens
    if size > model_max_tokens:
        raise ConfigurationError(
            f"RAGSERVICE_CHUNK_MAX_TOKENS={size} exceeds the embedding model's maximum "
            f"of {model_max_tokens} tokens"
        )
    try:
        return ChunkingOptions(max_tokens=size, overlap_tokens=settings.chunk_overlap_tokens)
    except ValueError as exc:
        raise ConfigurationError(f"chunking settings: {exc}") from exc
