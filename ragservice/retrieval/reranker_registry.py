"""Registered rerankers (`ragservice finetune --reranker`): `NAME[:VERSION]` → their row.

`RAGSERVICE_RERANKER` names a registered reranker as `NAME:VERSION` (or `NAME`, its latest
version) as well as a folder or a hub model; `registered_folder` tells them apart at startup.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session

from ragservice import store
from ragservice.db import Database
from ragservice.db.models import RerankerModel
from ragservice.embedding.registry import parse_model_ref
from ragservice.errors import ConfigurationError, NotFoundError


def get_reranker(session: Session, ref: str) -> RerankerModel:
    """The registered reranker `NAME[:VERSION]`; NotFoundError naming the known ones otherwise."""
    name, version = parse_model_ref(ref)
    row = store.rerankers.get_reranker(session, name, version)
    if row is None:
        raise NotFoundError(f"no reranker {ref!r}; registered: {known(session) or 'none'}")
    return row


def known(session: Session) -> str:
    return ", ".join(f"{r.name}:{r.version}" for r in store.rerankers.list_rerankers(session))


def registered_folder(db: Database, ref: str) -> str | None:
    """The folder of the registered reranker `ref`, or None when `ref` is a folder or a hub
    model id. A `NAME:VERSION` that is not registered is a configuration error: no hub id
    has a colon, so it can only be a mistyped or missing version."""
    if Path(ref).expanduser().is_dir():
        return None
    name, version = parse_model_ref(ref)
    with db.read() as session:
        row = store.rerankers.get_reranker(session, name, version)
        if row is None and version is not None:
            raise ConfigurationError(
                f"RAGSERVICE_RERANKER={ref!r}: no such registered reranker; registered: "
                f"{known(session) or 'none'} (`ragservice rerankers list`)"
            )
    if row is None:
        return None
    if not Path(row.path).is_dir():
        raise ConfigurationError(
            f"reranker {row.name}:{row.version} has no folder here ({row.path})"
        )
    return row.path
