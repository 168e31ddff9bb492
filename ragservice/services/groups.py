"""Groups of a tenant's users (documents name groups among their readers): their members
added and removed, each change audited, and listed. The caller's transactions must see the
tenant's rows (the API's request scope, the CLI's operator scope)."""

from __future__ import annotations

import uuid

from ragservice import store
from ragservice.db import Database
from ragservice.services.callers import Caller, audit


def add_members(db: Database, caller: Caller, group: str, users: list[str]) -> int:
    """Add `users` to the caller's tenant's `group`; how many were not members yet."""
    with db.write() as session:
        added = store.tenants.add_group_members(session, caller.tenant_id, group, users)
        audit(session, caller, "group.add", group, {"users": users})
    return added


def remove_members(db: Database, caller: Caller, group: str, users: list[str]) -> int:
    """Remove `users` from the caller's tenant's `group`; how many were members."""
    with db.write() as session:
        removed = store.tenants.remove_group_members(session, caller.tenant_id, group, users)
        audit(session, caller, "group.remove", group, {"users": users})
    return removed


def members(db: Database, tenant_id: uuid.UUID) -> dict[str, list[str]]:
    """Each group of the tenant with its users, by name."""
    with db.read() as session:
        return store.tenants.group_members(session, tenant_id)
