"""Analysts: login roles with read-only SQL access to the analytics views, bound to one tenant
or to every tenant. Each function works in an owner's session (CREATE ROLE, GRANT), the
operator's transaction; each change is audited in it."""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session

from ragservice import store
from ragservice.services.callers import record_operation
from ragservice.store.analysts import ANALYST_GROUP, Analyst

__all__ = ["ANALYST_GROUP", "Analyst"]


def add_analyst(
    session: Session,
    name: str,
    password: str,
    *,
    tenant_id: uuid.UUID | None,
    timeout_seconds: int,
    actor: str,
) -> None:
    """Create the analyst's role, reading `tenant_id`'s rows (None: every tenant's)."""
    store.analysts.create_analyst(
        session, name, password, tenant_id=tenant_id, timeout_seconds=timeout_seconds
    )
    _audit(session, "analyst.add", name, tenant_id, actor)


def update_analyst(
    session: Session, name: str, *, tenant_id: uuid.UUID | None, timeout_seconds: int, actor: str
) -> None:
    """Bind the analyst to `tenant_id` (None: every tenant) and set its timeouts again; no
    role may create temporary tables here after it."""
    store.analysts.bind_analyst(session, name, tenant_id=tenant_id)
    store.analysts.set_timeouts(session, name, timeout_seconds)
    store.analysts.restrict_temporary(session)
    _audit(session, "analyst.update", name, tenant_id, actor)


def list_analysts(session: Session) -> list[Analyst]:
    """Each analyst by name, with its binding in this database and its timeouts."""
    return store.analysts.list_analysts(session)


def remove_analyst(session: Session, name: str, *, actor: str) -> bool:
    """Drop the analyst's role and binding; False when no analyst has that name."""
    removed = store.analysts.remove_analyst(session, name)
    if removed:
        _audit(session, "analyst.remove", name, None, actor)
    return removed


def temporary_tables_open(session: Session) -> bool:
    """Whether PUBLIC (so every analyst) may still create temporary tables in this database."""
    return store.analysts.public_may_create_temporary(session)


def _audit(
    session: Session, action: str, name: str, tenant_id: uuid.UUID | None, actor: str
) -> None:
    """`tenant_id` None (every tenant, or a removal): an entry operators alone see."""
    record_operation(
        session,
        tenant_id=tenant_id,
        actor=actor,
        action=action,
        target=name,
        details={"all_tenants": tenant_id is None and action != "analyst.remove"},
    )
