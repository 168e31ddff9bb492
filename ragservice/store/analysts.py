"""Analyst roles: PostgreSQL logins that read the analytics views, the tenant each is bound to
(`analyst_tenants`, migration 0008), their timeouts, and the database ACL that keeps them from
creating temporary objects. DDL here runs as the database owner (`Database.owner()`)."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from psycopg import sql
from sqlalchemy import delete, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from ragservice.db.engine import SERVICE_ROLE, driver_connection
from ragservice.db.models import AnalystTenant, Tenant
from ragservice.errors import ConfigurationError, ConflictError, InvalidInputError, NotFoundError

# The NOLOGIN role migration 0006 creates; it may read the views in schema `analytics` only.
ANALYST_GROUP = "ragservice_analyst"
ANALYST_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
# Role settings an analyst gets (both to the same number of seconds); shown by `list_analysts`.
TIMEOUT_SETTINGS = ("statement_timeout", "idle_in_transaction_session_timeout")

# The members of the group that are analysts. Members with ADMIN OPTION are not: PostgreSQL 16
# makes a creator of the group role that is not a superuser such a member.
_MEMBERS = """
    SELECT r.rolname, r.rolcanlogin, r.rolconfig FROM pg_roles r
    JOIN pg_auth_members m ON m.member = r.oid
    JOIN pg_roles g ON g.oid = m.roleid
    WHERE g.rolname = :group AND NOT m.admin_option
"""


@dataclass(frozen=True)
class Analyst:
    name: str
    can_login: bool
    bound: bool
    """Whether this database binds the analyst to a tenant or to all (False: sees no rows)."""
    tenant: str | None
    """The tenant's name; None with `bound`: every tenant."""
    timeouts: dict[str, str]
    """The role's settings among `TIMEOUT_SETTINGS` (e.g. statement_timeout → "60s")."""


def _analyst_name(name: str) -> str:
    if not ANALYST_NAME.fullmatch(name):
        raise InvalidInputError(
            f"{name!r} is not a valid analyst name: lowercase letters, digits and _, "
            "starting with a letter or _, at most 63 characters"
        )
    return name


def create_analyst(
    session: Session,
    name: str,
    password: str,
    *,
    tenant_id: uuid.UUID | None,
    timeout_seconds: int,
) -> None:
    """A LOGIN role in `ragservice_analyst`, bound to `tenant_id` (None: every tenant; both
    must be said), with `timeout_seconds` as its statement and idle-in-transaction timeout.
    Roles are server-wide; the binding is this database's (`analyst_tenants`)."""
    _analyst_name(name)
    conn = driver_connection(session)
    if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ANALYST_GROUP,)).fetchone():
        raise ConfigurationError(
            f"role {ANALYST_GROUP} is missing: migration 0006 could not create it (the database "
            "user may not create roles); see docs/analysts.md for the statements to run as an "
            "administrator"
        )
    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
        raise ConflictError(f"a role named {name!r} already exists")
    _require_tenant(session, tenant_id)
    conn.execute(
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {}").format(
            sql.Identifier(name), sql.Literal(password), sql.Identifier(ANALYST_GROUP)
        )
    )
    set_timeouts(session, name, timeout_seconds)
    bind_analyst(session, name, tenant_id=tenant_id)
    restrict_temporary(session)


def bind_analyst(session: Session, name: str, *, tenant_id: uuid.UUID | None) -> None:
    """Bind the analyst to `tenant_id` (None: every tenant) in this database, replacing any
    binding it had. NotFoundError for a name that is no analyst or an unknown tenant."""
    if name not in {analyst.name for analyst in list_analysts(session)}:
        raise NotFoundError(f"no analyst named {name!r}")
    _require_tenant(session, tenant_id)
    binding = insert(AnalystTenant).values(role_name=name, tenant_id=tenant_id)
    # EXCLUDED's time, not now(): Citus refuses functions that are not IMMUTABLE in DO UPDATE.
    session.execute(
        binding.on_conflict_do_update(
            index_elements=[AnalystTenant.role_name],
            set_={"tenant_id": tenant_id, "created_at": binding.excluded.created_at},
        )
    )


def set_timeouts(session: Session, name: str, seconds: int) -> None:
    """`ALTER ROLE … SET` each of `TIMEOUT_SETTINGS` to `seconds` (a default for the role's
    sessions: PostgreSQL lets a session change it with SET)."""
    _analyst_name(name)
    if seconds < 1:
        raise InvalidInputError("an analyst's timeout must be at least 1 second")
    conn = driver_connection(session)
    for setting in TIMEOUT_SETTINGS:
        conn.execute(
            sql.SQL("ALTER ROLE {} SET {} = {}").format(
                sql.Identifier(name), sql.Identifier(setting), sql.Literal(f"{seconds}s")
            )
        )


def restrict_temporary(session: Session) -> bool:
    """Keep analysts (and everyone not granted it) from creating temporary objects in this
    database: TEMPORARY granted to the service role, revoked from PUBLIC and the analysts'
    group. Idempotent; False (nothing changed) when the current user does not own the
    database. Migration 0008 does the same; a database made from a template or restored from
    a plain dump starts with PostgreSQL's default ACL again, so adding an analyst re-applies it."""
    conn = driver_connection(session)
    row = conn.execute(
        "SELECT current_database(), pg_has_role(current_user, d.datdba, 'USAGE') "
        "FROM pg_database d WHERE d.datname = current_database()"
    ).fetchone()
    assert row is not None
    database, owns = row
    if not owns:
        return False
    target = sql.Identifier(database)
    roles = {
        str(r[0])
        for r in conn.execute(
            "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", ([SERVICE_ROLE, ANALYST_GROUP],)
        )
    }
    if SERVICE_ROLE in roles:
        conn.execute(
            sql.SQL("GRANT TEMPORARY ON DATABASE {} TO {}").format(
                target, sql.Identifier(SERVICE_ROLE)
            )
        )
    if ANALYST_GROUP in roles:
        conn.execute(
            sql.SQL("REVOKE TEMPORARY ON DATABASE {} FROM {}").format(
                target, sql.Identifier(ANALYST_GROUP)
            )
        )
    conn.execute(sql.SQL("REVOKE TEMPORARY ON DATABASE {} FROM PUBLIC").format(target))
    return True


def public_may_create_temporary(session: Session) -> bool:
    """Whether PUBLIC (so every analyst) holds TEMPORARY on this database."""
    return bool(
        session.execute(
            text("SELECT has_database_privilege('public', current_database(), 'TEMPORARY')")
        ).scalar_one()
    )


def list_analysts(session: Session) -> list[Analyst]:
    """Each analyst (member of `ragservice_analyst`) by name, with its binding in this database
    and its timeouts. Reads `analyst_tenants`: an owner session."""
    members = session.execute(text(_MEMBERS + " ORDER BY r.rolname"), {"group": ANALYST_GROUP})
    bindings = {
        row.role_name: row.tenant
        for row in session.execute(
            select(AnalystTenant.role_name, Tenant.name.label("tenant")).outerjoin(
                Tenant, Tenant.id == AnalystTenant.tenant_id
            )
        )
    }
    analysts = []
    for name, login, config in members:
        timeouts = {}
        for item in config or ():
            setting, _, value = str(item).partition("=")
            if setting in TIMEOUT_SETTINGS:
                timeouts[setting] = value
        analysts.append(
            Analyst(
                name=str(name),
                can_login=bool(login),
                bound=name in bindings,
                tenant=bindings.get(name),
                timeouts=timeouts,
            )
        )
    return analysts


def remove_analyst(session: Session, name: str) -> bool:
    """Drop an analyst's role and its binding; False when no member of `ragservice_analyst` has
    that name (other roles are never dropped here)."""
    _analyst_name(name)
    if name not in {analyst.name for analyst in list_analysts(session)}:
        return False
    session.execute(delete(AnalystTenant).where(AnalystTenant.role_name == name))
    driver_connection(session).execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
    return True


def _require_tenant(session: Session, tenant_id: uuid.UUID | None) -> None:
    if tenant_id is not None and session.get(Tenant, tenant_id) is None:
        raise NotFoundError(f"no tenant with id {tenant_id}")
