"""Opens what a process of the service needs: the database and the embedding model it serves,
runs the retention purge (the query log, job payloads) a server repeats in the background, and
gives its metrics what they read at scrape time."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta

from prometheus_client.registry import Collector

from ragservice import store
from ragservice.chunking import ChunkingOptions
from ragservice.config import (
    DEFAULT_TENANT_ID,
    IngestSettings,
    RetentionSettings,
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
from ragservice.metrics import (
    EmbeddedCollector,
    EmbeddingCollector,
    QueueCollector,
    ReplicaCollector,
)
from ragservice.periodic import Periodic

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
            active = store.models.active_model(session)
        if active is not None and loadable(active, settings.embedding):
            if not warm:
                return serve_embedder(active, load_embedder(settings, active))
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
            storage=settings.vector_storage,
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


_PURGE_BATCH = 10_000


@dataclass(frozen=True, slots=True)
class PurgeReport:
    """What one retention purge deleted."""

    queries: int = 0
    feedback: int = 0
    job_items: int = 0


def purge_retention(
    db: Database,
    retention: RetentionSettings,
    *,
    query_log_days: int | None = None,
    job_payload_hours: float | None = None,
) -> PurgeReport:
    """Delete, across tenants, logged queries (with their feedback) older than the query log
    retention, and the items of jobs that ended longer ago than the job payload retention.
    The arguments override the settings. Queries go in batches, each its own transaction."""
    days = retention.query_log_retention_days if query_log_days is None else query_log_days
    hours = (
        retention.job_payload_retention_hours if job_payload_hours is None else job_payload_hours
    )
    queries = feedback = 0
    with tenancy.as_system():
        with db.write() as session:
            items = store.jobs.purge_job_payloads(session, older_than=timedelta(hours=hours))
        while days > 0:
            with db.write() as session:
                batch, batch_feedback = store.query_log.purge_query_log(
                    session, older_than_days=days, limit=_PURGE_BATCH
                )
            queries, feedback = queries + batch, feedback + batch_feedback
            if batch < _PURGE_BATCH:
                break
    return PurgeReport(queries=queries, feedback=feedback, job_items=items)


class RetentionPurger:
    """Runs `purge_retention` at start and then every `RAGSERVICE_RETENTION_PURGE_SECONDS`."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._rounds = Periodic(
            "retention-purger",
            self.purge_once,
            runtime.settings.retention.retention_purge_seconds,
            what="the retention purge",
            at_start=True,
        )

    def start(self) -> None:
        self._rounds.start()

    def stop(self, timeout: float) -> None:
        self._rounds.stop(timeout)

    def purge_once(self) -> PurgeReport:
        report = purge_retention(self._runtime.db, self._runtime.settings.retention)
        if report != PurgeReport():
            log.info("retention purge: %s", report)
        return report


def runtime_collectors(runtime: Runtime) -> list[Collector]:
    """What a process's metrics read from its runtime at scrape time: the job queue (one
    count, cached a few seconds), the embedding model's slots, with replicas the read
    router's last checks, and with a supervised embedded server its supervisor's status."""
    db = runtime.db

    def queue_depth() -> tuple[int, int]:
        with tenancy.as_system(), db.read(primary=True) as session:
            return store.jobs.queue_depth(session)

    def embedding_slots() -> tuple[int, int]:
        return runtime.models.current().embedder.slot_use()

    collectors: list[Collector] = [QueueCollector(queue_depth), EmbeddingCollector(embedding_slots)]
    if db.router is not None:
        collectors.append(ReplicaCollector(db.router.status))
    supervisor = runtime.supervisor
    if supervisor is not None:
        collectors.append(EmbeddedCollector(lambda: supervisor.status().describe()))
    return collectors
