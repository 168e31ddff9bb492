"""The db layer: embedded server sharing, pgvector checks, migrations matching the models."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

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
    assert resolve_database_url(settings) == "postgresql+psycopg://u:p@db:5432/rag"


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
