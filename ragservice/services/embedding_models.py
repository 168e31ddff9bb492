"""The embedding model versions as a tenant's admin sees them, and the service admin's switch
(activate, roll back) with the switched model's row. The model is shared by every tenant:
the checks and the audit are `embedding/registry.py`'s."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from ragservice.db import Database, tenancy
from ragservice.db.models import EmbeddingModel
from ragservice.embedding import indexing, registry
from ragservice.services.callers import Caller
from ragservice.store.indexes import BuildProgress as BuildProgress  # the CLI's progress bars
from ragservice.store.indexes import storage_of as storage_of  # the CLI's --storage check


@dataclass(frozen=True)
class Switched:
    model: dict[str, Any]
    """The model now active, as `model_rows` shows it."""
    changed: bool
    previous_id: int | None


def model_rows(db: Database, *, every_tenant: bool, primary: bool = False) -> list[dict[str, Any]]:
    """Every registered version, the active one marked (`registry.model_row`). `embedded` and
    `chunks` count every tenant's chunks when `every_tenant` (what an activation checks), else
    the chunks the caller's transaction sees: its tenant's, within a request."""
    tenants = tenancy.as_system() if every_tenant else nullcontext()
    with tenants, db.read(primary=primary) as session:
        statuses = registry.model_statuses(session)
    return [registry.model_row(status, statuses) for status in statuses]


def activate(db: Database, caller: Caller, ref: str, *, force: bool) -> Switched:
    """Make `NAME[:VERSION]` the active model (ConflictError while chunks lack its
    embeddings, unless `force`; NotFoundError for one not registered); audited."""
    switch = registry.activate(db, ref, force=force, actor=caller.actor, key_id=caller.key_id)
    return _switched(db, switch)


def rollback(db: Database, caller: Caller, *, force: bool) -> Switched:
    """Activate again the model the latest activation replaced (ConflictError when there is
    none); audited."""
    switch = registry.rollback(db, force=force, actor=caller.actor, key_id=caller.key_id)
    return _switched(db, switch)


def _switched(db: Database, switch: registry.Switch) -> Switched:
    rows = model_rows(db, every_tenant=True, primary=True)  # the switch just committed there
    model = next(row for row in rows if row["id"] == switch.model.id)
    return Switched(model=model, changed=switch.changed, previous_id=switch.previous_id)


# -- the operator's commands (`ragservice models`) ------------------------------------------


def registered_models(db: Database) -> list[dict[str, Any]]:
    """Every registered version as `model_rows` shows it (every tenant's chunks counted), with
    the folder it loads from."""
    with tenancy.as_system(), db.read() as session:
        statuses = registry.model_statuses(session)
    return [
        {**registry.model_row(status, statuses), "path": status.model.path} for status in statuses
    ]


def model_named(db: Database, ref: str) -> EmbeddingModel:
    """The registered model `NAME[:VERSION]`; NotFoundError naming the known ones otherwise."""
    with db.read() as session:
        return registry.get_model_by_name(session, ref)


def switch_to(db: Database, ref: str, *, force: bool, actor: str) -> registry.Switch:
    """`activate` for an operator without an API key."""
    return registry.activate(db, ref, force=force, actor=actor)


def switch_back(db: Database, *, force: bool, actor: str) -> registry.Switch:
    """`rollback` for an operator without an API key."""
    return registry.rollback(db, force=force, actor=actor)


def drop_embeddings(db: Database, ref: str, *, actor: str) -> tuple[EmbeddingModel, int]:
    """Delete a model's chunk embeddings (every tenant's) and its HNSW index, audited; refused
    for the active model. The model and the embeddings deleted."""
    return registry.drop_embeddings(db, ref, actor=actor)


def convert_storage(
    db: Database, model: EmbeddingModel, storage: str, *, progress: indexing.Progress
) -> indexing.Conversion:
    """Keep the model's vectors as `storage`, its index built again after (`progress`)."""
    return indexing.convert_storage(db, model, storage, progress=progress)


def rebuild_index(
    db: Database, model: EmbeddingModel, *, progress: indexing.Progress
) -> indexing.IndexBuild:
    """Drop the model's HNSW index and build it again (`progress`)."""
    indexing.drop_embedding_index(db, model)
    return indexing.build_embedding_index(db, model, progress=progress)
