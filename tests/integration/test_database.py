"""The db layer: embedded server sharing, pgvector checks, migrations matching the models."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from ragservice.config import Settings
from ragservice.db import migrate, open_database
from ragservice.db.embedded import embedded_database_url
from ragservice.db.engine import resolve_database_url
from ragservice.db.models import Base
from ragservice.errors import DatabaseUnavailableError


def test_models_match_the_migrations(database_url: str) -> None:
    """Alembic alone defines the schema; the typed models must describe the same tables."""
    engine = create_engine(database_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    tables_or_columns = [
        d for d in diff if d[0] in ("add_table", "remove_table", "add_column", "remove_column")
    ]
    assert tables_or_columns == []


def test_migrations_are_current_and_default_tenant_exists(settings: Settings) -> None:
    db = open_database(settings)
    try:
        assert migrate.is_current(db.write_engine)
        with db.read() as session:
            from sqlalchemy import text

            assert session.execute(text("SELECT name FROM tenants")).scalars().all() == ["default"]
    finally:
        db.dispose()


def test_unreachable_database_gives_a_clear_error(tmp_path: Path) -> None:
    settings = Settings(database_url="postgresql://nobody@127.0.0.1:1/none", data_dir=tmp_path)
    with pytest.raises(DatabaseUnavailableError, match="RAGSERVICE_DATABASE_URL"):
        open_database(settings)


def test_url_without_driver_gets_psycopg(tmp_path: Path) -> None:
    settings = Settings(database_url="postgresql://u:p@db:5432/rag", data_dir=tmp_path)
    assert resolve_database_url(settings.database) == "postgresql+psycopg://u:p@db:5432/rag"


def test_embedded_server_is_shared_between_processes(tmp_path: Path) -> None:
    """A second process joins the running server, and its exit does not stop it for us."""
    url = embedded_database_url(tmp_path)
    libpq = url.replace("postgresql+psycopg://", "postgresql://")
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        import psycopg
        from ragservice.db.embedded import embedded_database_url
        url = embedded_database_url(Path({str(tmp_path)!r}))
        with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
            conn.execute("CREATE TABLE shared_check (x int)")
            conn.execute("INSERT INTO shared_check VALUES (42)")
        print(url)
        """
    )
    child = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == url
    with psycopg.connect(libpq) as conn:
        assert conn.execute("SELECT x FROM shared_check").fetchone() == (42,)


def test_reads_on_the_primary_are_read_only(settings: Settings) -> None:
    """A write slipped into `read()` fails everywhere, not only where a replica serves it."""
    from sqlalchemy import text
    from sqlalchemy.exc import InternalError

    db = open_database(settings)
    try:
        with pytest.raises(InternalError, match="read-only transaction"), db.read() as session:
            session.execute(text("INSERT INTO tenants (name) VALUES ('sneaky')"))
    finally:
        db.dispose()


def test_database_errors_never_carry_the_values_sent(settings: Settings) -> None:
    """Error messages get logged (and a 500 quotes nothing, but logs do): the values bound to a
    failing statement, users' text or secrets, stay out of them."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    db = open_database(settings)
    try:
        with pytest.raises(DBAPIError) as failure, db.write() as session:
            session.execute(
                text("INSERT INTO tenants (name, id) VALUES (:name, CAST(:id AS uuid))"),
                {"name": "secret-marker-7f3a", "id": "not-a-uuid"},
            )
        assert "secret-marker-7f3a" not in str(failure.value)
        assert "parameters hidden" in str(failure.value)
    finally:
        db.dispose()


def test_deferred_writes_wait_for_the_end_of_a_request_and_fail_alone(settings: Settings) -> None:
    from sqlalchemy import func, select, text

    from ragservice.db.models import Tenant
    from ragservice.db.scope import parse_lsn, request_scope

    def add(name: str) -> Callable[[Session], object]:
        return lambda session: session.execute(
            text("INSERT INTO tenants (name) VALUES (:name)"), {"name": name}
        )

    def tenants() -> list[str]:
        with db.read() as session:
            return list(session.scalars(select(Tenant.name).order_by(Tenant.name)))

    def failing(session: Session) -> None:
        session.execute(text("INSERT INTO no_such_table VALUES (1)"))

    db = open_database(settings)
    try:
        db.write_later(add("at-once"))  # no request: written now
        assert "at-once" in tenants()
        with request_scope() as scope:
            db.write_later(add("later"))
            db.write_later(failing)
            db.write_later(add("also-later"))
            assert "later" not in tenants()
            with db.write() as session:
                session.execute(text("SELECT 1"))
            token = scope.token()
            assert token is not None and parse_lsn(token) > 0
        db.run_writes(scope.deferred)
        assert {"later", "also-later"} <= set(tenants())  # the failing one rolled back alone
        with db.read() as session:
            assert session.scalar(select(func.count()).select_from(Tenant)) == 4
    finally:
        db.dispose()
