"""Reranker model versions (cross-encoders the service trained): no tenant data."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from ragservice.db.models import RerankerModel


def next_version(session: Session, name: str) -> int:
    """The version a new reranker called `name` gets. Holds a lock on the name until the
    transaction ends, so two registrations at once never pick the same version."""
    session.execute(
        text("SELECT pg_advisory_xact_lock(hashtext('reranker_models:' || :name))"),
        {"name": name},
    )
    latest = get_reranker(session, name)
    return 1 if latest is None else latest.version + 1


def register(
    session: Session, *, name: str, version: int, path: str, base: str, details: dict[str, Any]
) -> RerankerModel:
    row = RerankerModel(name=name, version=version, path=path, base=base, details=details)
    session.add(row)
    session.flush()
    return row


def get_reranker(session: Session, name: str, version: int | None = None) -> RerankerModel | None:
    """The reranker `name` at `version`, or its latest version when `version` is None."""
    stmt = select(RerankerModel).where(RerankerModel.name == name)
    if version is not None:
        stmt = stmt.where(RerankerModel.version == version)
    return session.scalars(stmt.order_by(RerankerModel.version.desc()).limit(1)).first()


def list_rerankers(session: Session) -> list[RerankerModel]:
    order = (RerankerModel.name, RerankerModel.version)
    return list(session.scalars(select(RerankerModel).order_by(*order)))
