"""Tenants and their API keys (only hashes are stored)."""

from __future__ import annotations

import uuid

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from ragservice.db.models import ApiKey, Tenant


def ensure_tenant(session: Session, name: str) -> uuid.UUID:
    """The id of the tenant `name`, created if it does not exist."""
    session.execute(insert(Tenant).values(name=name).on_conflict_do_nothing())
    tenant_id = session.scalar(select(Tenant.id).where(Tenant.name == name))
    assert tenant_id is not None
    return tenant_id


def create_api_key(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    role: str,
    prefix: str,
    key_hash: str,
    name: str | None = None,
) -> uuid.UUID:
    key = ApiKey(tenant_id=tenant_id, role=role, prefix=prefix, key_hash=key_hash, name=name)
    session.add(key)
    session.flush()
    return key.id


def get_api_key(session: Session, key_hash: str) -> ApiKey | None:
    """The key with this hash, unless it was revoked."""
    stmt = select(ApiKey).where(ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None))
    return session.scalar(stmt)


def list_api_keys(session: Session) -> list[tuple[ApiKey, str]]:
    """Every key with its tenant's name, newest first."""
    stmt = (
        select(ApiKey, Tenant.name)
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .order_by(ApiKey.created_at.desc())
    )
    return [(row[0], row[1]) for row in session.execute(stmt)]


def revoke_api_key(session: Session, prefix: str) -> int:
    """Revoke the keys that start with `prefix`; returns how many were revoked."""
    stmt = (
        update(ApiKey)
        .where(ApiKey.prefix == prefix, ApiKey.revoked_at.is_(None))
        .values(revoked_at=func.now())
    )
    return int(session.execute(stmt).rowcount)  # type: ignore[attr-defined]


def find_tenant_id(session: Session, name: str) -> uuid.UUID | None:
    return session.scalar(select(Tenant.id).where(Tenant.name == name))
