"""Embed the corpus with another model, beside the one being served.

Chunks are taken in id order (a keyset, so each batch is one indexed range scan), only those
without an embedding of the model; each batch is embedded, written with one COPY and committed
on its own. An interrupted run leaves whole batches only, and a second run does only what is
missing, so resuming is just running again. Serving goes on with the active model meanwhile:
its rows and index are never touched. The texts are the chunks' stored texts, exactly what
ingest embedded for the active model.

A model that is not active serves no searches, so its HNSW index is dropped while its vectors
load and built once at the end (`indexing.build_embedding_index`: far faster than keeping it
up row by row). The active model's index is kept up as rows arrive.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ragservice import store
from ragservice.config import IndexSettings
from ragservice.db import Database, tenancy
from ragservice.db.models import EmbeddingModel
from ragservice.embedding import indexing
from ragservice.embedding.embedder import Vectors
from ragservice.errors import EmbeddingError

log = logging.getLogger(__name__)

Progress = Callable[[int], None]
"""Called with the number of chunks each committed batch embedded."""


class BatchEmbedder(Protocol):
    def embed(self, texts: Sequence[str]) -> Vectors: ...


@dataclass(frozen=True)
class ReembedReport:
    model_id: int
    missing_at_start: int
    embedded: int
    batches: int
    seconds: float
    index: indexing.IndexBuild | None = None
    """The index build at the end (a model that is not active), or None."""

    @property
    def chunks_per_second(self) -> float:
        return self.embedded / self.seconds if self.seconds > 0 else 0.0


def count_missing(db: Database, model_id: int) -> int:
    """Chunks of every tenant that have no embedding of the model yet."""
    with tenancy.as_system(), db.read() as session:
        return store.embedding_models.missing_embeddings(session, model_id)


def reembed(
    db: Database,
    index: IndexSettings,
    model: EmbeddingModel,
    embedder: BatchEmbedder,
    *,
    batch_size: int,
    on_batch: Progress | None = None,
    missing: int | None = None,
    on_index: indexing.Progress | None = None,
) -> ReembedReport:
    """Embed every chunk that has no embedding of `model` with `embedder`, `batch_size`
    chunks per transaction. `missing`: the count at start, when the caller already has it.
    `on_index`: the progress of the index build at the end (a model that is not active).
    Cross-tenant: every tenant's chunks, whoever calls."""
    with tenancy.as_system():
        report = _reembed(db, index, model, embedder, batch_size, on_batch, missing)
        if report.index is None and not _is_active(db, model):
            build = indexing.build_embedding_index(db, model, progress=on_index, index=index)
            report = dataclasses.replace(report, index=build)
        return report


def _is_active(db: Database, model: EmbeddingModel) -> bool:
    with db.read(primary=True) as session:
        row = store.embedding_models.get_model(session, model.id)
        return row is not None and row.active


def _reembed(
    db: Database,
    index: IndexSettings,
    model: EmbeddingModel,
    embedder: BatchEmbedder,
    batch_size: int,
    on_batch: Progress | None,
    missing: int | None,
) -> ReembedReport:
    started = time.perf_counter()
    total = count_missing(db, model.id) if missing is None else missing
    if _is_active(db, model):
        with db.write() as session:  # dropped by `models drop-embeddings`, perhaps: back again
            store.embedding_models.ensure_model_indexes(
                session,
                model,
                hnsw_m=index.hnsw_m,
                hnsw_ef_construction=index.hnsw_ef_construction,
            )
    elif total:
        indexing.drop_embedding_index(db, model)  # built once at the end (see `reembed`)
    embedded = batches = 0
    after: uuid.UUID | None = None
    while chunks := _next_batch(db, model.id, after, batch_size):
        embedded += _write_batch(db, model, embedder, chunks)
        batches += 1
        after = chunks[-1].id
        if on_batch is not None:
            on_batch(len(chunks))
    seconds = time.perf_counter() - started
    log.info("embedded %d chunks with model %d in %.1f s", embedded, model.id, seconds)
    return ReembedReport(model.id, total, embedded, batches, seconds)


def _next_batch(
    db: Database, model_id: int, after: uuid.UUID | None, size: int
) -> list[store.embedding_models.ChunkToEmbed]:
    with db.read() as session:
        return store.embedding_models.chunks_to_embed(session, model_id, after=after, limit=size)


def _write_batch(
    db: Database,
    model: EmbeddingModel,
    embedder: BatchEmbedder,
    chunks: list[store.embedding_models.ChunkToEmbed],
) -> int:
    vectors = embedder.embed([chunk.text for chunk in chunks])
    if vectors.shape != (len(chunks), model.dimension):
        raise EmbeddingError(
            f"the embedder gave vectors of shape {vectors.shape}; model {model.name} has "
            f"{model.dimension} dimensions"
        )
    with db.write() as session:
        return store.embedding_models.add_embeddings(session, model.id, chunks, vectors)
