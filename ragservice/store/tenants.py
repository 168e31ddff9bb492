"""Tenants and their API keys (only hashes are stored), and erasing a tenant."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from graphlib import TopologicalSorter

from psycopg import sql
from sqlalchemy import ScalarSelect, Select, delete, func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from ragservice.db.engine import driver_connection
from ragservice.db.models import ApiKey, Collection, Document, GroupMember, Tenant


def ensure_tenant(session: Session, name: str) -> uuid.UUID:
    """The id of the tenant `name`, created if it does not exist."""
    session.execute(insert(Tenant).values(name=name).on_conflict_do_nothing())
    tenant_id = session.scalar(select(Tenant.id).where(Tenant.name == name))
    assert tenant_id is not None
    return tenant_id


def get_tenant_name(session: Session, tenant_id: uuid.UUID) -> str | None:
    return session.scalar(select(Tenant.name).where(Tenant.id == tenant_id))


def create_api_key(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    role: str,
    prefix: str,
    key_hash: str,
    name: str | None = None,
    expires_at: datetime | None = None,
    user_name: str | None = None,
) -> uuid.UUID:
    """`user_name`: the user the key acts for (it reads what that user may read)."""
    key = ApiKey(
        tenant_id=tenant_id,
        role=role,
        prefix=prefix,
        key_hash=key_hash,
        name=name,
        expires_at=expires_at,
        user_name=user_name,
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


def user_groups(session: Session, tenant_id: uuid.UUID, user_name: str) -> list[str]:
    """The groups of the tenant that `user_name` belongs to, by name."""
    stmt = (
        select(GroupMember.group_name)
        .where(GroupMember.tenant_id == tenant_id, GroupMember.user_name == user_name)
        .order_by(GroupMember.group_name)
    )
    return list(session.scalars(stmt))


def add_group_members(
    session: Session, tenant_id: uuid.UUID, group_name: str, user_names: list[str]
) -> int:
    """Add users to a group (those already in it stay); returns how many were added."""
    if not user_names:
        return 0
    rows = [{"tenant_id": tenant_id, "group_name": group_name, "user_name": u} for u in user_names]
    # Counted from RETURNING: an ORM insert of several rows reports no rowcount (-1).
    stmt = (
        insert(GroupMember).values(rows).on_conflict_do_nothing().returning(GroupMember.user_name)
    )
    return len(session.scalars(stmt).all())


def remove_group_members(
    session: Session, tenant_id: uuid.UUID, group_name: str, user_names: list[str]
) -> int:
    """Remove users from a group; returns how many were in it."""
    stmt = delete(GroupMember).where(
        GroupMember.tenant_id == tenant_id,
        GroupMember.group_name == group_name,
        GroupMember.user_name.in_(user_names),
    )
    return int(session.execute(stmt).rowcount)  # type: ignore[attr-defined]


def group_members(session: Session, tenant_id: uuid.UUID) -> dict[str, list[str]]:
    """Every group of the tenant with its users, by name."""
    stmt = (
        select(GroupMember.group_name, GroupMember.user_name)
        .where(GroupMember.tenant_id == tenant_id)
        .order_by(GroupMember.group_name, GroupMember.user_name)
    )
    groups: dict[str, list[str]] = {}
    for group, user in session.execute(stmt):
        groups.setdefault(group, []).append(user)
    return groups


def find_tenant_id(session: Session, name: str) -> uuid.UUID | None:
    return session.scalar(select(Tenant.id).where(Tenant.name == name))


@dataclass(frozen=True, slots=True)
class TenantInfo:
    id: uuid.UUID
    name: str
    created_at: datetime
    collections: int
    documents: int
    active_keys: int


def list_tenants(session: Session) -> list[TenantInfo]:
    """Every tenant with its numbers of collections, documents and active keys, by name."""
    collections = _count(select(func.count()).where(Collection.tenant_id == Tenant.id))
    documents = _count(select(func.count()).where(Document.tenant_id == Tenant.id))
    keys = _count(
        select(func.count()).where(ApiKey.tenant_id == Tenant.id, ApiKey.revoked_at.is_(None))
    )
    stmt = select(Tenant.id, Tenant.name, Tenant.created_at, collections, documents, keys)
    return [TenantInfo(*row) for row in session.execute(stmt.order_by(Tenant.name))]


def _count(stmt: Select[int]) -> ScalarSelect[int]:
    return stmt.correlate(Tenant).scalar_subquery()


# Tables of the public schema with a tenant_id column that the current user may delete from.
# Read from the catalog, so tables added later are erased too without a change here.
_TENANT_TABLES = text("""
SELECT c.relname FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
  AND a.attname = 'tenant_id' AND NOT a.attisdropped AND c.relname <> 'tenants'
  AND has_table_privilege(c.oid, 'DELETE')
""")

# (referencing, referenced) pairs of the foreign keys between tables of the public schema.
_FOREIGN_KEYS = text("""
SELECT child.relname, parent.relname FROM pg_constraint k
JOIN pg_class child ON child.oid = k.conrelid
JOIN pg_class parent ON parent.oid = k.confrelid
WHERE k.contype = 'f' AND k.connamespace = 'public'::regnamespace
""")


def erase_tenant(
    session: Session, tenant_id: uuid.UUID, *, keep_tenant: bool = False
) -> dict[str, int]:
    """Delete every row of the tenant from every table that has a `tenant_id` column (rows
    that reference others first), then the tenant itself unless `keep_tenant`. Every table
    holding a tenant's rows has the column (BM25 postings, job items and cache sources since
    migration 0030). Returns the rows deleted per table, tables without any left out.

    Run it as the whole database (`tenancy.as_system()`) in one transaction: the erase is
    all or nothing."""
    tables = list(session.scalars(_TENANT_TABLES))
    conn = driver_connection(session)
    erased: dict[str, int] = {}
    for table in _children_first(session, tables):
        statement = sql.SQL("DELETE FROM {} WHERE tenant_id = %s").format(sql.Identifier(table))
        count = conn.execute(statement, (tenant_id,)).rowcount
        if count:
            erased[table] = count
    if not keep_tenant:
        erased["tenants"] = conn.execute("DELETE FROM tenants WHERE id = %s", (tenant_id,)).rowcount
    return erased


def _children_first(session: Session, tables: list[str]) -> list[str]:
    """`tables` ordered so that a table comes before every table it references."""
    wanted = set(tables)
    referenced_by: dict[str, set[str]] = {table: set() for table in sorted(wanted)}
    for child, parent in session.execute(_FOREIGN_KEYS):
        if child in wanted and parent in wanted and child != parent:
            referenced_by[parent].add(child)
    return list(TopologicalSorter(referenced_by).static_order())
