"""A model's chunk vectors as stored (float32, halfvec or binary) and its HNSW index: the
index DDL (through the SECURITY DEFINER functions of migrations 0007 and 0015), the build's
memory and workers, its progress, and rewriting a model's rows into another storage."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, get_args

import psycopg
from psycopg import sql
from sqlalchemy import text
from sqlalchemy.orm import Session

from ragservice.errors import InvalidInputError

Storage = Literal["float32", "halfvec", "binary"]
STORAGES: tuple[str, ...] = get_args(Storage)

# A vector of any storage, as float32: what readers that need the numbers (re-use of stored
# vectors at ingest, evaluation) select. `e` is chunk_embeddings.
FULL_VECTOR = "coalesce(e.embedding, e.embedding_half::vector)"

STAGED_COLUMNS = ("chunk_id", "model_id", "tenant_id", "embedding")

# Rows staged as float32 (chunk_id, model_id, tenant_id, embedding) go into the column their
# model's storage says, with their chunk's collection and readers (migration 0034: what a
# restricted or filtered dense search selects by): one statement for every writer, whatever the
# storage. A row whose chunk is gone is skipped.
INSERT_STAGED = sql.SQL("""
INSERT INTO chunk_embeddings
    (chunk_id, model_id, tenant_id, embedding, embedding_half, collection_id, readers)
SELECT s.chunk_id, s.model_id, s.tenant_id,
       CASE WHEN m.storage = 'halfvec' THEN NULL ELSE s.embedding END,
       CASE WHEN m.storage = 'halfvec' THEN s.embedding::halfvec END,
       c.collection_id, c.readers
FROM {staging} s JOIN embedding_models m ON m.id = s.model_id
JOIN chunks c ON c.id = s.chunk_id AND c.tenant_id = s.tenant_id
ON CONFLICT DO NOTHING""")


def storage_of(value: str) -> Storage:
    """`value` as a storage; InvalidInputError naming the known ones otherwise."""
    if value not in STORAGES:
        raise InvalidInputError(
            f"vector storage must be one of {', '.join(STORAGES)}, not {value!r}"
        )
    return value  # type: ignore[return-value]


def insert_staged(conn: psycopg.Connection[Any], staging: str) -> int:
    """Move the rows of the temporary table `staging` into chunk_embeddings (see
    `INSERT_STAGED`): only rows whose chunk exists; rows already stored are skipped. Returns
    the rows inserted."""
    statement = INSERT_STAGED.format(staging=sql.Identifier(staging))
    return conn.execute(statement).rowcount


@contextmanager
def as_login(session: Session) -> Iterator[None]:
    """Run the SECURITY DEFINER index functions (DDL needs the tables' owner: they run with its
    rights, migrations 0007 and 0015) with this transaction's role reset to the login's, and
    the role set again afterwards. On Citus, `SET LOCAL` commands reach the workers
    (`citus.propagate_set_commands = 'local'`), the role among them, so the index's DDL on the
    shards would run as the system role the service switched to ("must be owner")."""
    role = session.scalar(text("SELECT current_setting('role')"))
    if role in (None, "none"):
        yield
        return
    session.execute(text("SET LOCAL ROLE NONE"))
    try:
        yield
    finally:
        session.execute(text(f"SET LOCAL ROLE {_quoted_role(str(role))}"))


def _quoted_role(role: str) -> str:
    return '"' + role.replace('"', '""') + '"'


def ensure_index(
    session: Session, model_id: int, dimension: int, storage: str, *, m: int, ef_construction: int
) -> None:
    """The model's partial HNSW index for its storage (a no-op when it exists)."""
    with as_login(session):
        session.execute(
            text("SELECT ragservice_ensure_embedding_index(:id, :dim, :m, :ef, :storage)"),
            {"id": model_id, "dim": dimension, "m": m, "ef": ef_construction, "storage": storage},
        )


def drop_index(session: Session, model_id: int) -> None:
    # DDL needs the table's owner: the function runs with its rights (migration 0007).
    with as_login(session):
        session.execute(text("SELECT ragservice_drop_embedding_index(:id)"), {"id": model_id})


def has_index(session: Session, model_id: int) -> bool:
    name = f"chunk_embeddings_hnsw_model_{int(model_id)}"
    return bool(session.scalar(text("SELECT to_regclass(:name) IS NOT NULL"), {"name": name}))


def index_bytes(session: Session, model_id: int) -> int:
    name = f"chunk_embeddings_hnsw_model_{int(model_id)}"
    size = session.scalar(text("SELECT pg_relation_size(to_regclass(:name))"), {"name": name})
    return int(size or 0)


def set_build_resources(session: Session, *, memory_mb: int, workers: int) -> None:
    """This transaction's maintenance_work_mem and parallel maintenance workers (SET LOCAL)."""
    # SET LOCAL (not set_config): on Citus the workers that build the shards' indexes get it.
    session.execute(
        text(
            f"SET LOCAL maintenance_work_mem = '{int(memory_mb)}MB'; "
            f"SET LOCAL max_parallel_maintenance_workers = {int(workers)}"
        )
    )


def backend_pid(session: Session) -> int:
    return int(session.scalar(text("SELECT pg_backend_pid()")) or 0)


@dataclass(frozen=True, slots=True)
class BuildProgress:
    """One look at an index build (pg_stat_progress_create_index): its phase and counts."""

    phase: str
    blocks_done: int = 0
    blocks_total: int = 0
    tuples_done: int = 0
    tuples_total: int = 0


def build_progress(session: Session, pid: int) -> BuildProgress | None:
    """The progress of the index build the backend `pid` runs, or None when it runs none."""
    row = session.execute(
        text(
            "SELECT phase, blocks_done, blocks_total, tuples_done, tuples_total "
            "FROM pg_stat_progress_create_index WHERE pid = :pid"
        ),
        {"pid": pid},
    ).first()
    if row is None:
        return None
    return BuildProgress(str(row[0]), *(int(v or 0) for v in row[1:]))


# Rewrites of a model's rows from one storage to another (float32 and binary share a column).
_TO_HALF = text(
    "UPDATE chunk_embeddings SET embedding_half = embedding::halfvec, embedding = NULL "
    "WHERE model_id = :id AND embedding IS NOT NULL"
)
_TO_FULL = text(
    "UPDATE chunk_embeddings SET embedding = embedding_half::vector, embedding_half = NULL "
    "WHERE model_id = :id AND embedding_half IS NOT NULL"
)


def rewrite_rows(session: Session, model_id: int, target: Storage) -> int:
    """Move the model's vectors into the column of `target`; returns the rows rewritten."""
    statement = _TO_HALF if target == "halfvec" else _TO_FULL
    return int(session.execute(statement, {"id": model_id}).rowcount)  # type: ignore[attr-defined]


def table_bytes_per_row(session: Session, model_id: int) -> float:
    """Average bytes a row of the model takes in chunk_embeddings (tuple and vector)."""
    value = session.scalar(
        text("SELECT avg(pg_column_size(e.*)) FROM chunk_embeddings e WHERE e.model_id = :id"),
        {"id": model_id},
    )
    return float(value or 0.0)
