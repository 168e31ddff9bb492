"""Embedding model versions, their activations and the embeddings stored for each."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import ColumnElement, delete, func, select, text, update
from sqlalchemy.orm import Session

from ragservice.db.engine import driver_connection
from ragservice.db.models import (
    Chunk,
    ChunkEmbedding,
    EmbeddingModel,
    ModelActivation,
    PromptCacheEntry,
)
from ragservice.errors import ConfigurationError
from ragservice.store import bulk, indexes


def stored_embeddings(
    session: Session, *, tenant_id: uuid.UUID, model_id: int, hashes: Sequence[str]
) -> dict[str, npt.NDArray[np.float32]]:
    """Stored vectors of chunk texts with these hashes: identical text is embedded once."""
    if not hashes:
        return {}
    rows = session.execute(
        text(
            "SELECT DISTINCT ON (c.content_hash) c.content_hash, "
            f"{indexes.FULL_VECTOR} "
            "FROM chunks c JOIN chunk_embeddings e "
            "ON e.chunk_id = c.id AND e.tenant_id = c.tenant_id AND e.model_id = :model "
            "WHERE c.tenant_id = :tenant AND c.content_hash = ANY(:hashes)"
        ),
        {"model": model_id, "tenant": tenant_id, "hashes": list(hashes)},
    )
    return {row[0]: row[1].to_numpy().astype(np.float32, copy=False) for row in rows}


def ensure_model(
    session: Session,
    *,
    name: str,
    dimension: int,
    path: str | None,
    hnsw_m: int,
    hnsw_ef_construction: int,
    storage: str = "float32",
) -> EmbeddingModel:
    """The latest version of the model `name`, registered as version 1 (with `storage`) when
    the name is new, with its HNSW index; activated when no model is active yet. A model with
    the same name but another dimension is refused."""
    _lock_name(session, name)
    model = get_model_by_name(session, name)
    if model is None:
        model = register_model_version(
            session,
            name=name,
            version=1,
            dimension=dimension,
            path=path,
            base_model_id=None,
            details={},
            hnsw_m=hnsw_m,
            hnsw_ef_construction=hnsw_ef_construction,
            storage=storage,
        )
    elif model.dimension != dimension:
        raise ConfigurationError(
            f"embedding model {name!r} is registered with dimension {model.dimension}, "
            f"but the loaded model has {dimension}"
        )
    else:
        ensure_model_indexes(
            session, model, hnsw_m=hnsw_m, hnsw_ef_construction=hnsw_ef_construction
        )
    if session.scalar(select(EmbeddingModel.id).where(EmbeddingModel.active)) is None:
        session.execute(
            update(EmbeddingModel).where(EmbeddingModel.id == model.id).values(active=True)
        )
        model.active = True
    return model


def ensure_model_indexes(
    session: Session, model: EmbeddingModel, *, hnsw_m: int, hnsw_ef_construction: int
) -> None:
    """The model's partial HNSW indexes on chunk embeddings (for its storage) and on the
    prompt cache (float32 always)."""
    indexes.ensure_index(
        session,
        model.id,
        model.dimension,
        model.storage,
        m=hnsw_m,
        ef_construction=hnsw_ef_construction,
    )
    with indexes.as_login(session):
        session.execute(
            text("SELECT ragservice_ensure_cache_index(:id, :dim)"),
            {"id": model.id, "dim": model.dimension},
        )


def set_storage(session: Session, model_id: int, storage: indexes.Storage) -> int:
    """Record the model's storage and move its rows into that storage's column (with the
    caller's transaction: a failure leaves both as they were). Returns the rows rewritten."""
    rewritten = indexes.rewrite_rows(session, model_id, storage)
    session.execute(
        update(EmbeddingModel).where(EmbeddingModel.id == model_id).values(storage=storage)
    )
    return rewritten


@dataclass(frozen=True, slots=True)
class ChunkToEmbed:
    id: uuid.UUID
    tenant_id: uuid.UUID
    text: str


def active_model(session: Session) -> EmbeddingModel | None:
    return session.scalar(select(EmbeddingModel).where(EmbeddingModel.active))


def get_model(session: Session, model_id: int) -> EmbeddingModel | None:
    return session.get(EmbeddingModel, model_id)


def get_model_by_name(
    session: Session, name: str, version: int | None = None
) -> EmbeddingModel | None:
    """The model `name` at `version`, or its latest version when `version` is None."""
    stmt = select(EmbeddingModel).where(EmbeddingModel.name == name)
    if version is not None:
        stmt = stmt.where(EmbeddingModel.version == version)
    return session.scalars(stmt.order_by(EmbeddingModel.version.desc()).limit(1)).first()


def list_models(session: Session) -> list[EmbeddingModel]:
    order = (EmbeddingModel.name, EmbeddingModel.version)
    return list(session.scalars(select(EmbeddingModel).order_by(*order)))


def embedded_counts(session: Session) -> dict[int, int]:
    """model id → chunks that have an embedding of that model (models without any are absent)."""
    rows = session.execute(
        text("SELECT model_id, count(*) FROM chunk_embeddings GROUP BY model_id")
    )
    return {int(row[0]): int(row[1]) for row in rows}


def embedded_count(session: Session, model_id: int) -> int:
    """Chunk embeddings of the model (of the tenants the transaction sees)."""
    stmt = select(func.count()).select_from(ChunkEmbedding)
    return int(session.scalar(stmt.where(ChunkEmbedding.model_id == model_id)) or 0)


def chunk_total(session: Session) -> int:
    return int(session.scalar(select(func.count()).select_from(Chunk)) or 0)


def missing_embeddings(session: Session, model_id: int) -> int:
    """Chunks, of every tenant, without an embedding of the model."""
    stmt = select(func.count()).select_from(Chunk).where(~_has_embedding(model_id))
    return int(session.scalar(stmt) or 0)


def chunks_to_embed(
    session: Session, model_id: int, *, after: uuid.UUID | None, limit: int
) -> list[ChunkToEmbed]:
    """The next `limit` chunks by id after `after` that have no embedding of the model."""
    stmt = select(Chunk.id, Chunk.tenant_id, Chunk.text).where(~_has_embedding(model_id))
    if after is not None:
        stmt = stmt.where(Chunk.id > after)
    rows = session.execute(stmt.order_by(Chunk.id).limit(limit))
    return [ChunkToEmbed(id=row[0], tenant_id=row[1], text=row[2]) for row in rows]


def _has_embedding(model_id: int) -> ColumnElement[bool]:
    # The tenant too: on Citus a correlated subquery must join on the distribution column.
    return (
        select(ChunkEmbedding.chunk_id)
        .where(
            ChunkEmbedding.chunk_id == Chunk.id,
            ChunkEmbedding.tenant_id == Chunk.tenant_id,
            ChunkEmbedding.model_id == model_id,
        )
        .exists()
    )


def add_embeddings(
    session: Session,
    model_id: int,
    chunks: Sequence[ChunkToEmbed],
    vectors: npt.NDArray[np.float32],
) -> int:
    """Store the chunks' vectors of the model (one COPY), in its storage's column; chunks
    deleted meanwhile and embeddings another writer stored first are skipped. Returns the
    rows inserted."""
    conn = driver_connection(session)
    conn.execute(
        "CREATE TEMP TABLE new_embeddings "
        "(chunk_id uuid, model_id int4, tenant_id uuid, embedding vector) ON COMMIT DROP"
    )
    rows = [(c.id, model_id, c.tenant_id, v) for c, v in zip(chunks, vectors, strict=True)]
    types = ("uuid", "int4", "uuid", "vector")
    bulk.copy_rows(conn, "new_embeddings", indexes.STAGED_COLUMNS, types, rows)
    return indexes.insert_staged(conn, "new_embeddings")


def next_model_version(session: Session, name: str) -> int:
    """The version a new model called `name` gets. Holds a lock on the name until the
    transaction ends, so two registrations at once never pick the same version."""
    _lock_name(session, name)
    latest = get_model_by_name(session, name)
    return 1 if latest is None else latest.version + 1


def _lock_name(session: Session, name: str) -> None:
    session.execute(
        text("SELECT pg_advisory_xact_lock(hashtext('embedding_models:' || :name))"),
        {"name": name},
    )


def register_model_version(
    session: Session,
    *,
    name: str,
    version: int,
    dimension: int,
    path: str | None,
    base_model_id: int | None,
    details: dict[str, Any],
    hnsw_m: int,
    hnsw_ef_construction: int,
    storage: str = "float32",
) -> EmbeddingModel:
    """Record a model version (see `next_model_version`), inactive, kept in `storage`, with
    its HNSW index. The one way a model row is made: `ensure_model` registers a new name
    through it too."""
    model = EmbeddingModel(
        storage=indexes.storage_of(storage),
        name=name,
        version=version,
        dimension=dimension,
        path=path,
        base_model_id=base_model_id,
        details=details,
        active=False,
    )
    session.add(model)
    session.flush()
    ensure_model_indexes(session, model, hnsw_m=hnsw_m, hnsw_ef_construction=hnsw_ef_construction)
    return model


def activate_model(session: Session, model_id: int) -> int | None:
    """Make the model the active one and record the switch; returns the previously active
    model's id. Servers notice the change at their next model check."""
    # Locks the (small) table's rows: two activations at once run one after the other.
    rows = session.scalars(select(EmbeddingModel).with_for_update()).all()
    previous = next((row.id for row in rows if row.active), None)
    if previous == model_id:
        return previous
    session.execute(update(EmbeddingModel).where(EmbeddingModel.active).values(active=False))
    session.execute(update(EmbeddingModel).where(EmbeddingModel.id == model_id).values(active=True))
    session.add(ModelActivation(model_id=model_id, previous_model_id=previous))
    session.flush()
    return previous


def last_activation(session: Session) -> ModelActivation | None:
    stmt = select(ModelActivation).order_by(ModelActivation.id.desc()).limit(1)
    return session.scalars(stmt).first()


def drop_model_embeddings(session: Session, model_id: int) -> int:
    """Delete the model's chunk embeddings, their HNSW index and its cache entries."""
    deleted = session.execute(
        delete(ChunkEmbedding).where(ChunkEmbedding.model_id == model_id)
    ).rowcount  # type: ignore[attr-defined]
    session.execute(delete(PromptCacheEntry).where(PromptCacheEntry.model_id == model_id))
    indexes.drop_index(session, model_id)
    return int(deleted)
