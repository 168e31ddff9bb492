"""The audit log: administrative actions of the caller's tenant, newest first."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from ragservice.db.models import AuditEntry

MAX_AUDIT_PAGE = 500


class AuditEntryOut(BaseModel):
    id: int = Field(description="increasing; pass the last one as `before` for the next page")
    at: datetime
    actor: str = Field(description="`key:<prefix>` for an API key, `cli:<OS user>` for the CLI")
    key_id: uuid.UUID | None
    action: str = Field(description="e.g. `collection.delete`, `cache.purge`, `key.create`")
    target: str
    details: dict[str, Any]


class AuditPage(BaseModel):
    entries: list[AuditEntryOut]
    next_before: int | None = Field(
        description="the `before` of the next (older) page; null when this page is the last"
    )


def audit_page(entries: list[AuditEntry], limit: int) -> AuditPage:
    return AuditPage(
        entries=[
            AuditEntryOut(
                id=entry.id,
                at=entry.at,
                actor=entry.actor,
                key_id=entry.key_id,
                action=entry.action,
                target=entry.target,
                details=entry.details,
            )
            for entry in entries
        ],
        next_before=entries[-1].id if len(entries) == limit else None,
    )
