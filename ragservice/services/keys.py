"""API keys as operators manage them across tenants: create (the secret returned once), list,
revoke; each change audited."""

from __future__ import annotations

from datetime import UTC, datetime

from ragservice import store
from ragservice.auth.keys import NewKey, Role, new_key
from ragservice.db import Database, tenancy
from ragservice.db.models import ApiKey
from ragservice.services.callers import record_operation


def create_key(
    db: Database,
    tenant: str,
    role: Role,
    *,
    actor: str,
    name: str | None = None,
    expires_at: datetime | None = None,
    user_name: str | None = None,
) -> NewKey:
    """A new key of `role` for the tenant named `tenant` (created if new); only its hash is
    stored, the secret is in the returned key alone."""
    key = new_key()
    with tenancy.as_system(), db.write() as session:
        tenant_id = store.tenants.ensure_tenant(session, tenant)
        store.tenants.create_api_key(
            session,
            tenant_id=tenant_id,
            role=role,
            prefix=key.prefix,
            key_hash=key.hash,
            name=name,
            expires_at=expires_at,
            user_name=user_name,
        )
        details = {"role": str(role), "name": name, "expires_at": _iso(expires_at)}
        record_operation(
            session,
            tenant_id=tenant_id,
            actor=actor,
            action="key.create",
            target=key.prefix,
            details={**details, "user": user_name},
        )
    return key


def list_keys(db: Database) -> list[tuple[ApiKey, str]]:
    """Every tenant's keys, each with its tenant's name."""
    with tenancy.as_system(), db.read() as session:
        return store.tenants.list_api_keys(session)


def revoke_keys(db: Database, prefix: str, *, actor: str) -> list[ApiKey]:
    """Revoke the active keys with `prefix` (audited, each in its tenant's log); the keys
    revoked, none for a prefix no active key has."""
    with tenancy.as_system(), db.write() as session:
        revoked = store.tenants.revoke_api_key(session, prefix)
        for key in revoked:
            record_operation(
                session,
                tenant_id=key.tenant_id,
                actor=actor,
                action="key.revoke",
                target=key.prefix,
                details={"role": key.role, "name": key.name},
            )
    return revoked


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.astimezone(UTC).isoformat(timespec="seconds")
