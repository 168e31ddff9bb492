"""Analyst roles: PostgreSQL logins that read the analytics views."""

from __future__ import annotations

import re

import psycopg
from sqlalchemy import text
from sqlalchemy.orm import Session

from ragservice.db.engine import driver_connection
from ragservice.errors import ConfigurationError, ConflictError, InvalidInputError

# The NOLOGIN role migration 0006 creates; it may read the views in schema `analytics` only.
ANALYST_GROUP = "ragservice_analyst"
ANALYST_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def _analyst_name(name: str) -> str:
    if not ANALYST_NAME.fullmatch(name):
        raise InvalidInputError(
            f"{name!r} is not a valid analyst name: lowercase letters, digits and _, "
            "starting with a letter or _, at most 63 characters"
        )
    return name


def create_analyst(session: Session, name: str, password: str) -> None:
    """A LOGIN role in `ragservice_analyst`. Roles are server-wide: one role reaches the
    analytics views of every database on the server that granted them."""
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
    conn.execute(
        psycopg.sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {}").format(
            psycopg.sql.Identifier(name),
            psycopg.sql.Literal(password),
            psycopg.sql.Identifier(ANALYST_GROUP),
        )
    )


def list_analysts(session: Session) -> list[tuple[str, bool]]:
    """(name, can log in) for each member of `ragservice_analyst`, by name."""
    rows = session.execute(
        text(
            "SELECT r.rolname, r.rolcanlogin FROM pg_roles r "
            "JOIN pg_auth_members m ON m.member = r.oid "
            "JOIN pg_roles g ON g.oid = m.roleid "
            "WHERE g.rolname = :group ORDER BY r.rolname"
        ),
        {"group": ANALYST_GROUP},
    ).all()
    return [(str(name), bool(login)) for name, login in rows]


def remove_analyst(session: Session, name: str) -> bool:
    """Drop an analyst's role; False when no member of `ragservice_analyst` has that name (other
    roles are never dropped here)."""
    _analyst_name(name)
    if name not in {analyst for analyst, _ in list_analysts(session)}:
        return False
    driver_connection(session).execute(
        psycopg.sql.SQL("DROP ROLE {}").format(psycopg.sql.Identifier(name))
    )
    return True
