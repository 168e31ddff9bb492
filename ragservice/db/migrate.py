"""Runs the Alembic migrations; the server and the CLI call `upgrade` on start."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

import migrations

# Any fixed number: concurrent starts (server and CLI at once) take turns on the upgrade.
_MIGRATION_LOCK_KEY = 0x7261_6773


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision`, holding an advisory lock so concurrent starts are safe."""
    config = alembic_config()
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
        try:
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
            conn.commit()
        except BaseException:
            conn.rollback()  # the failed migration's transaction, so the unlock can run
            raise
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _MIGRATION_LOCK_KEY})
            conn.commit()


def current_revision(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def is_current(engine: Engine) -> bool:
    with engine.connect() as conn:
        return current_revision(conn) == head_revision()
