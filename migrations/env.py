"""Alembic environment. Run through `ragservice db upgrade` (ragservice.db.migrate), which passes
an open connection; `alembic` on the command line works too with `-x url=postgresql+psycopg://...`."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from ragservice.db.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = context.get_x_argument(as_dictionary=True).get("url")
    if not url:
        raise SystemExit(
            "pass the database with: alembic -x url=postgresql+psycopg://... upgrade head"
        )
    with create_engine(url).connect() as conn:
        _run(conn)
        conn.commit()


def _run(connection: object) -> None:
    context.configure(connection=connection, target_metadata=target_metadata)  # type: ignore[arg-type]
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported")
run_migrations_online()
