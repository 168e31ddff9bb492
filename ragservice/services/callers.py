"""Who calls a service function, as far as the service needs to know: the tenant its work is
scoped to and the key and actor the audit log names. The API's `Principal` is one; the CLI
builds its own."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy.orm import Session

from ragservice import store


class Caller(Protocol):
    """The caller of an audited action."""

    @property
    def tenant_id(self) -> uuid.UUID: ...

    @property
    def key_id(self) -> uuid.UUID | None: ...

    @property
    def actor(self) -> str: ...


@dataclass(frozen=True)
class Operator:
    """A caller without an API key: an operator at the command line (`actor` `cli:<user>`)."""

    tenant_id: uuid.UUID
    actor: str
    key_id: uuid.UUID | None = None


def audit(
    session: Session,
    caller: Caller,
    action: str,
    target: str,
    details: dict[str, Any] | None = None,
) -> None:
    """Record an action of `caller` in its tenant's audit log, in `session`'s transaction: the
    action and its entry commit together or not at all."""
    store.audit.record(
        session,
        tenant_id=caller.tenant_id,
        key_id=caller.key_id,
        actor=caller.actor,
        action=action,
        target=target,
        details=details,
    )


def record_operation(
    session: Session,
    *,
    tenant_id: uuid.UUID | None,
    actor: str,
    action: str,
    target: str,
    details: dict[str, Any] | None = None,
) -> None:
    """Record an operator's action in `session`'s transaction; `tenant_id` None for an entry
    about the deployment (or about a tenant being erased), which operators alone see."""
    store.audit.record(
        session, tenant_id=tenant_id, actor=actor, action=action, target=target, details=details
    )
