"""Tenants and their API keys (only hashes are stored)."""

from __future__ import annotations

import uuid
from datetime import datetime

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
    expires_at: datetime | None = None,
) -> uuid.UUID:
    key = ApiKey(
        tenant_id=tenant_id,
        role=role,
        prefix=prefix,
        key_hash=key_hash,
        name=name,
        expires_at=expires_at,
    )
    session.add(key)
    session.flush()
    return key.id


def get_api_key(session: Session, key_hash: str) -> ApiKey | None:
    """The key with this hash, unless it was revoked (an expired key is returned: the caller
    says so)."""
    stmt = select(ApiKey).where(ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None))
    return session.scalar(stmt)


def touch_api_key(session: Session, key_id: uuid.UUID, *, every_seconds: int) -> None:
    """Set the key's `last_used_at` to now, unless it was set within `every_seconds` (so a
    busy key costs one write per interval, not one per request)."""
    stale = func.now() - func.make_interval(0, 0, 0, 0, 0, 0, every_seconds)
    stmt = (
        update(ApiKey)
        .where(ApiKey.id == key_id)
        .where((ApiKey.last_used_at.is_(None)) | (ApiKey.last_used_at < stale))
        .values(last_used_at=func.now())
    )
    session.execute(stmt)


def list_api_keys(session: Session) -> list[tuple[ApiKey, str]]:
    """Every key with its tenant's name, newest first."""
    stmt = (
        select(ApiKey, Tenant.name)
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .order_by(ApiKey.created_at.desc())
    )
    return [(row[0], row[1]) for row in session.execute(stmt)]


def revoke_api_key(session: Session, prefix: str) -> list[ApiKey]:
    """Revoke the keys that start with `prefix`; returns the keys revoked."""
    stmt = (
        update(ApiKey)
        .where(ApiKey.prefix == prefix, ApiKey.revoked_at.is_(None))
        .values(revoked_at=func.now())
        .returning(ApiKey)
    )
    return list(session.scalars(stmt))


def find_tenant_id(session: Session, name: str) -> uuid.UUID | None:
    return session.scalar(select(Tenant.id).where(Tenant.name == name))
