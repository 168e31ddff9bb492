"""The runtime of a process of the service (`Runtime`, `open_runtime`): the database, with
its embedded server's supervisor, and the embedding model it serves; the chunking that model
reads; the check that a serving process cannot leave row-level security."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from ragservice import store
from ragservice.chunking import ChunkingOptions
from ragservice.config import (
    DEFAULT_TENANT_ID,
    IngestSettings,
    SecuritySettings,
    Settings,
)
from ragservice.db import Database, open_database, tenancy
from ragservice.db.supervisor import EmbeddedSupervisor, supervise_embedded
from ragservice.embedding.embedder import SentenceTransformerEmbedder, make_embedder
from ragservice.embedding.registry import (
    ModelRegistry,
    ServingModel,
    load_embedder,
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
    supervisor: EmbeddedSupervisor | None = None
    """Watches the embedded PostgreSQL and restarts it (`open_runtime(supervise=True)`)."""

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
        return chunking_options(self.settings.ingest, embedder.max_tokens)

    def close(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()  # first: no restart while the process lets the server go
        self.models.stop()
        self.db.dispose()


def open_runtime(
    settings: Settings,
    *,
    embedder: SentenceTransformerEmbedder | None = None,
    warm: bool = True,
    supervise: bool = False,
) -> Runtime:
    """Start or join PostgreSQL, migrate, and load the embedding model to serve: the active
    one when this process can load it (a fine-tuned version, say), else the configured one,
    registered (and activated when no model is active yet).

    Pass an `embedder` that is already loaded to share one model between runtimes (tests); it
    is registered and served first. `runtime.models.start()` then follows activations.

    `warm=False` leaves the active model unloaded until something embeds or tokenizes with it
    (a bulk import of vectors never does); a model that must first be registered still loads.

    `supervise`: a long-running process (serve, worker) on the embedded server watches it and
    starts it again when it exits (`db.supervisor`; its pools are reset then).
    """
    db = open_database(settings)
    supervisor = None
    if supervise:
        supervisor = supervise_embedded(settings.database, on_restart=lambda: reset_pools(db))
    try:
        initial = _initial_model(db, settings, embedder, warm=warm)
    except BaseException:
        if supervisor is not None:
            supervisor.stop()
        db.dispose()
        raise
    models = ModelRegistry(db, settings, initial)
    return Runtime(settings=settings, db=db, models=models, supervisor=supervisor)


def reset_pools(db: Database) -> None:
    """Drop every pooled connection (they point at a server that is gone); checked-out ones
    are closed when returned. The next checkout connects afresh."""
    for engine in db.engines():
        engine.dispose()


def require_unprivileged_login(db: Database, security: SecuritySettings) -> None:
    """A process that serves tenants refuses a login that could leave row-level security
    (`RESET ROLE` back to a superuser or the tables' owner), unless the operator allows it."""
    if db.privileged_login is None:
        return
    problem = (
        f"the service's database login is {db.privileged_login}: any SQL it is tricked into "
        "running could leave row-level security (RESET ROLE). Give the service a login of its "
        "own (docs/operators.md#tenant-isolation)"
    )
    if not security.allow_no_row_security:
        raise ConfigurationError(f"{problem}, or set RAGSERVICE_ALLOW_NO_ROW_SECURITY=1")
    log.warning("%s; serving anyway (RAGSERVICE_ALLOW_NO_ROW_SECURITY)", problem)


def _initial_model(
    db: Database, settings: Settings, embedder: SentenceTransformerEmbedder | None, *, warm: bool
) -> ServingModel:
    if embedder is None:
        with db.read() as session:
            active = store.embedding_models.active_model(session)
        if active is not None and loadable(active, settings.embedding):
            if not warm:
                return serve_embedder(active, load_embedder(settings, active))
            return serve_row(settings, active)
        embedder = make_embedder(settings, owner=tenancy.current_tenant_id)
        embedder.warm_up()
    with db.write() as session:
        model = store.embedding_models.ensure_model(
            session,
            name=embedder.name,
            dimension=embedder.dimension,
            path=embedder.path,
            hnsw_m=settings.indexing.hnsw_m,
            hnsw_ef_construction=settings.indexing.hnsw_ef_construction,
            storage=settings.indexing.vector_storage,
        )
    if not model.active:
        log.warning("embedding model %s is registered but another model is active", embedder.name)
    return serve_embedder(model, embedder)


def chunking_options(ingest: IngestSettings, model_max_tokens: int) -> ChunkingOptions:
    """Chunk size from the settings, never above what the embedding model reads."""
    size = ingest.chunk_max_tokens or model_max_tokens
    if size > model_max_tokens:
        raise ConfigurationError(
            f"RAGSERVICE_CHUNK_MAX_TOKENS={size} exceeds the embedding model's maximum "
            f"of {model_max_tokens} tokens"
        )
    try:
        return ChunkingOptions(max_tokens=size, overlap_tokens=ingest.chunk_overlap_tokens)
    except ValueError as exc:
        raise ConfigurationError(f"chunking settings: {exc}") from exc
