"""Opens what a process of the service needs: the database and the embedding model it serves."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from ragservice import store
from ragservice.chunking import ChunkingOptions
from ragservice.config import DEFAULT_TENANT_ID, Settings
from ragservice.db import Database, open_database, tenancy
from ragservice.embedding.embedder import SentenceTransformerEmbedder, make_embedder
from ragservice.embedding.registry import (
    ModelRegistry,
    ServingModel,
    loadable,
    serve_embedder,
    serve_row,
)
from ragservice.errors import ConfigurationError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    db: Database
    models: ModelRegistry

    @property
    def embedder(self) -> SentenceTransformerEmbedder:
        """The serving model's embedder at this moment. A request or a job resolves
        `models.current()` once instead, so a switch cannot change its model halfway."""
        return self.models.current().embedder

    @property
    def model_id(self) -> int:
        """The serving model's id at this moment (see `embedder`)."""
        return self.models.current().id

    @property
    def default_tenant_id(self) -> uuid.UUID:
        return uuid.UUID(DEFAULT_TENANT_ID)

    def chunking_options(self, model: ServingModel | None = None) -> ChunkingOptions:
        """Chunking for `model` (default: the serving one)."""
        embedder = (model or self.models.current()).embedder
        return chunking_options(self.settings, embedder.max_tokens)

    def close(self) -> None:
        self.models.stop()
        self.db.dispose()


def open_runtime(
    settings: Settings, *, embedder: SentenceTransformerEmbedder | None = None
) -> Runtime:
    """Start or join PostgreSQL, migrate, and load the embedding model to serve: the active
    one when this process can load it (a fine-tuned version, say), else the configured one,
    registered (and activated when no model is active yet).

    Pass an `embedder` that is already loaded to share one model between runtimes (tests); it
    is registered and served first. `runtime.models.start()` then follows activations.
    """
    db = open_database(settings)
    try:
        initial = _initial_model(db, settings, embedder)
    except BaseException:
        db.dispose()
        raise
    return Runtime(settings=settings, db=db, models=ModelRegistry(db, settings, initial))


def _initial_model(
    db: Database, settings: Settings, embedder: SentenceTransformerEmbedder | None
) -> ServingModel:
    if embedder is None:
        with db.read() as session:
            active = store.models.active_model(session)
        if active is not None and loadable(active, settings):
            return serve_row(settings, active)
        embedder = make_embedder(settings, owner=tenancy.current_tenant_id)
        embedder.warm_up()
    with db.write() as session:
        model = store.models.ensure_model(
            session,
            name=embedder.name,
            dimension=embedder.dimension,
            path=embedder.path,
            hnsw_m=settings.hnsw_m,
            hnsw_ef_construction=settings.hnsw_ef_construction,
        )
    if not model.active:
        log.warning("embedding model %s is registered but another model is active", embedder.name)
    return serve_embedder(model, embedder)


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
