"""Tenants by name: finding one, listing, creating and erasing them, each change audited."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy.orm import Session

from ragservice import store
from ragservice.db import Database, tenancy
from ragservice.errors import NotFoundError
from ragservice.services.callers import record_operation
from ragservice.store.tenants import TenantInfo


def find_tenant_id(session: Session, name: str) -> uuid.UUID | None:
    """The id of the tenant named `name`, or None."""
    return store.tenants.find_tenant_id(session, name)


def require_tenant_id(session: Session, name: str, *, hint: str = "") -> uuid.UUID:
    """The id of the tenant named `name`; NotFoundError `no tenant named 'NAME'` followed by
    `hint` (what to do about it) for a name no tenant has."""
    found = store.tenants.find_tenant_id(session, name)
    if found is None:
        raise NotFoundError(f"no tenant named {name!r}{hint}")
    return found


def tenant_id_of(db: Database, name: str, *, hint: str = "") -> uuid.UUID:
    """`require_tenant_id` in a transaction of its own that sees every tenant."""
    with tenancy.as_system(), db.read() as session:
        return require_tenant_id(session, name, hint=hint)


def list_tenants(session: Session) -> list[TenantInfo]:
    """Every tenant with its counts of collections, documents and active keys."""
    return store.tenants.list_tenants(session)


def create_tenant(db: Database, name: str, *, actor: str) -> tuple[uuid.UUID, bool]:
    """The id of the tenant named `name`, created (and audited) if there was none; and whether
    it was created."""
    with tenancy.as_system(), db.write() as session:
        existing = store.tenants.find_tenant_id(session, name)
        tenant_id = existing or store.tenants.ensure_tenant(session, name)
        if existing is None:
            record_operation(
                session, tenant_id=tenant_id, actor=actor, action="tenant.create", target=name
            )
    return tenant_id, existing is None


@dataclass(frozen=True)
class Erasure:
    """What erasing a tenant did: the rows erased per table, and the analysts that were bound
    to it (they now read nothing)."""

    rows: dict[str, int]
    analysts: list[str]


def erase_tenant(
    session: Session, tenant_id: uuid.UUID, name: str, *, keep_tenant: bool, actor: str
) -> Erasure:
    """Erase every row that names the tenant, and the tenant unless `keep_tenant`, in the
    owner's `session`; the audit entry has no tenant (it would be erased with it)."""
    analysts = [a.name for a in store.analysts.list_analysts(session) if a.tenant == name]
    erased = store.tenants.erase_tenant(session, tenant_id, keep_tenant=keep_tenant)
    record_operation(
        session,
        tenant_id=None,
        actor=actor,
        action="tenant.delete",
        target=name,
        details={"rows": sum(erased.values()), "kept_tenant": keep_tenant},
    )
    return Erasure(erased, analysts)
