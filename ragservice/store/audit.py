"""The audit log: administrative actions, appended in the transaction of the action itself."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ragservice.db.models import AuditEntry

SYSTEM_ACTOR = "system"
"""The actor of an action that no key or operator asked for by name (library callers)."""


def record(
    session: Session,
    *,
    tenant_id: uuid.UUID | None,
    actor: str,
    action: str,
    target: str,
    key_id: uuid.UUID | None = None,
    details: dict[str, Any] | None = None,
) -> None:
    """Append one entry; it commits (or rolls back) with the session's transaction."""
    session.add(
        AuditEntry(
            tenant_id=tenant_id,
            key_id=key_id,
            actor=actor,
            action=action,
            target=target,
            details=details or {},
        )
    )
    session.flush()


def list_entries(
    session: Session,
    tenant_id: uuid.UUID | None,
    *,
    limit: int,
    before: int | None = None,
) -> list[AuditEntry]:
    """Entries newest first, at most `limit`, with ids below `before` (the previous page's
    last id). `tenant_id` None: every entry the transaction may see."""
    stmt = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
    if tenant_id is not None:
        stmt = stmt.where(AuditEntry.tenant_id == tenant_id)
    if before is not None:
        stmt = stmt.where(AuditEntry.id < before)
    return list(session.scalars(stmt))
