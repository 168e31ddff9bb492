"""Building a model's HNSW index in one go, and converting a model's vector storage.

An HNSW index kept up row by row during a large load is the slow path: every insert walks the
graph. For a model that serves no searches yet (a bulk import, `reembed` of a new version), the
fast path is to drop the index, load, and build it once at the end with enough
`maintenance_work_mem` for the graph to fit in memory and parallel maintenance workers.
`build_embedding_index` does that build and reports its progress from
`pg_stat_progress_create_index`, read on a second connection while the build runs.

Memory and workers are sized from the machine this process runs on (the database usually runs
beside it): `RAGSERVICE_INDEX_BUILD_MEMORY_MB` (0: a quarter of the available memory, at most
16 GB and at most half the free space of /dev/shm, where parallel workers share the graph)
and `RAGSERVICE_INDEX_BUILD_WORKERS` (unset: cores - 1; PostgreSQL's `max_parallel_workers`
still caps them).

The build is a plain CREATE INDEX (through the SECURITY DEFINER function, inside a
transaction, so not CONCURRENTLY): reads go on, writes to chunk_embeddings wait until it ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ragservice import store
from ragservice.config import IndexSettings, get_settings
from ragservice.db import Database, sizing, tenancy
from ragservice.db.models import EmbeddingModel
from ragservice.errors import ConflictError
from ragservice.store.indexes import BuildProgress

log = logging.getLogger(__name__)

Progress = Callable[[BuildProgress], None]
"""Called from another thread with each new look at the build, and once at the end with
phase `done`."""

_POLL_SECONDS = 0.5


@dataclass(frozen=True, slots=True)
class IndexBuild:
    """What one build did."""

    model_id: int
    storage: str
    rows: int
    seconds: float
    index_bytes: int
    memory_mb: int
    workers: int


def build_memory_mb(index: IndexSettings) -> int:
    """maintenance_work_mem for a build, in MB (see the module's docstring and
    `db.sizing.index_build_memory_mb`)."""
    if index.build_memory_mb > 0:
        return index.build_memory_mb
    shm_free = sizing.filesystem_mb(Path("/dev/shm"), free=True)
    return sizing.index_build_memory_mb(sizing.available_memory_mb(), shm_free)


def build_workers(index: IndexSettings) -> int:
    if index.build_workers is not None:
        return index.build_workers
    return max(sizing.cpu_count() - 1, 0)


def drop_embedding_index(db: Database, model: EmbeddingModel) -> None:
    """Drop the model's HNSW index (a no-op without one); its searches scan until a build."""
    with tenancy.as_system(), db.write() as session:
        store.indexes.drop_index(session, model.id)


def build_embedding_index(
    db: Database,
    model: EmbeddingModel,
    *,
    progress: Progress | None = None,
    index: IndexSettings | None = None,
) -> IndexBuild:
    """Build the model's HNSW index for its storage (drop it first to rebuild), with the
    build memory and workers of `index` (None: the process's settings), reporting to
    `progress`. A no-op build when the index exists already."""
    index = index or get_settings().indexing
    memory, workers = build_memory_mb(index), build_workers(index)
    started = time.perf_counter()
    with tenancy.as_system(), db.write() as session:
        row = store.embedding_models.get_model(session, model.id)
        if row is None:
            raise ConflictError(f"embedding model id {model.id} is gone")
        store.indexes.set_build_resources(session, memory_mb=memory, workers=workers)
        with _watching(db, store.indexes.backend_pid(session), progress):
            store.embedding_models.ensure_model_indexes(
                session,
                row,
                hnsw_m=index.hnsw_m,
                hnsw_ef_construction=index.hnsw_ef_construction,
            )
        storage = row.storage
    # Read in a transaction of its own: on Citus the build ran on the shards as the tables'
    # owner, and the system role may not read those placements after it in the same one.
    with tenancy.as_system(), db.read() as session:
        rows = store.embedding_models.embedded_count(session, model.id)
        size = store.indexes.index_bytes(session, model.id)
    seconds = time.perf_counter() - started
    if progress is not None:
        progress(BuildProgress("done", tuples_done=rows, tuples_total=rows))
    log.info("built the %s index of model %d (%d rows) in %.1f s", storage, model.id, rows, seconds)
    return IndexBuild(model.id, storage, rows, seconds, size, memory, workers)


class _watching:
    """Polls the build's progress on another connection while the block runs."""

    def __init__(self, db: Database, pid: int, progress: Progress | None) -> None:
        self._db, self._pid, self._progress = db, pid, progress
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="index-progress", daemon=True)

    def __enter__(self) -> None:
        if self._progress is not None:
            self._thread.start()

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        assert self._progress is not None
        last: BuildProgress | None = None
        while not self._stop.wait(_POLL_SECONDS):
            try:
                with self._db.read(primary=True) as session:
                    seen = store.indexes.build_progress(session, self._pid)
            except Exception:  # progress is a nicety: the build goes on without it
                log.debug("reading the index build's progress failed", exc_info=True)
                continue
            if seen is not None and seen != last:
                self._progress(seen)
                last = seen


# -- converting a model's storage ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Conversion:
    model: EmbeddingModel
    previous: str
    rows: int
    rewrite_seconds: float
    build: IndexBuild | None


def convert_storage(
    db: Database,
    model: EmbeddingModel,
    storage: str,
    *,
    progress: Progress | None = None,
    index: IndexSettings | None = None,
) -> Conversion:
    """Keep the model's vectors as `storage` from now on. One transaction drops the index,
    rewrites the model's rows (halfvec ↔ the others; float32 ↔ binary keeps them) and records
    the storage: a failure leaves the old state whole. The new index is built after it;
    until it is, searches of the model scan its rows without an index."""
    target = store.indexes.storage_of(storage)
    started = time.perf_counter()
    with tenancy.as_system(), db.write() as session:
        row = store.embedding_models.get_model(session, model.id)
        if row is None:
            raise ConflictError(f"embedding model id {model.id} is gone")
        previous = row.storage
        if previous == target:
            return Conversion(row, previous, 0, 0.0, None)
        store.indexes.drop_index(session, row.id)
        store.embedding_models.set_storage(session, row.id, target)
        rows = store.embedding_models.embedded_count(session, row.id)
    rewrite_seconds = time.perf_counter() - started
    log.info("model %d: %d rows now %s (was %s)", row.id, rows, target, previous)
    build = build_embedding_index(db, row, progress=progress, index=index)
    return Conversion(row, previous, rows, rewrite_seconds, build)
