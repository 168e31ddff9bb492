"""Engines and session factories. Reads and writes get separate factories from the start, so
read replicas can be routed here later without touching any caller."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pgvector.psycopg import register_vector
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from ragservice.config import Settings
from ragservice.db import migrate
from ragservice.db.embedded import embedded_database_url
from ragservice.errors import ConfigurationError, DatabaseUnavailableError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Database:
    """The service's handle on PostgreSQL: one engine per role and a session factory for each."""

    url: str
    write_engine: Engine
    read_engine: Engine
    write_sessions: sessionmaker[Session]
    read_sessions: sessionmaker[Session]

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A session on the primary; commits on success, rolls back on any error."""
        with self.write_sessions.begin() as session:
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A session for reads (a replica later); never commits."""
        with self.read_sessions() as session:
            yield session

    def dispose(self) -> None:
        self.write_engine.dispose()
        self.read_engine.dispose()


def resolve_database_url(settings: Settings) -> str:
    """The configured URL, or the embedded server's (started on demand) when none is set."""
    if settings.database_url:
        return _with_psycopg_driver(settings.database_url)
    return embedded_database_url(settings.data_dir)


def open_database(settings: Settings, *, run_migrations: bool = True) -> Database:
    """Connect, check pgvector, bring the schema up to date, and build the session factories."""
    url = resolve_database_url(settings)
    bootstrap = create_engine(url, poolclass=NullPool)
    try:
        check_pgvector(bootstrap)
        if run_migrations:
            migrate.upgrade(bootstrap)
    finally:
        bootstrap.dispose()
    write_engine = make_engine(url)
    read_engine = make_engine(url)
    return Database(
        url=url,
        write_engine=write_engine,
        read_engine=read_engine,
        write_sessions=sessionmaker(write_engine, expire_on_commit=False),
        read_sessions=sessionmaker(read_engine, expire_on_commit=False),
    )


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine whose connections know the `vector` type (needed for binary COPY)."""
    engine = create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10, **kwargs)
    event.listen(engine, "connect", _on_connect)
    return engine


def _on_connect(dbapi_connection: Any, _record: Any) -> None:
    register_vector(dbapi_connection)


def check_pgvector(engine: Engine) -> None:
    """Fail clearly when the server cannot be reached or has no pgvector to offer."""
    try:
        with engine.connect() as conn:
            available = conn.execute(
                text("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
            ).first()
    except OperationalError as exc:
        raise DatabaseUnavailableError(
            "cannot connect to PostgreSQL; check RAGSERVICE_DATABASE_URL"
        ) from exc
    if available is None:
        raise ConfigurationError(
            "the PostgreSQL server has no pgvector extension; install pgvector >= 0.7 "
            "(https://github.com/pgvector/pgvector) or unset RAGSERVICE_DATABASE_URL "
            "to use the embedded server"
        )


def _with_psycopg_driver(url: str) -> str:
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url
