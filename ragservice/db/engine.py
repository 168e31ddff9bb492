"""Engines and session factories; the one place that decides which node a session is on.

`Database.write()` is always on the primary. `Database.read()` within a request that only reads
goes where `routing.ReadRouter` says (a healthy, current replica, else the primary) and honours
the request's consistency token (`scope.RequestScope`); every other read is on the primary.
Sessions on the primary for reads are read-only, like a replica's, so a write slipped into a
read fails in every deployment, not only in those with replicas.

Every connection works as the `ragservice_service` role (migration 0007) when the connecting
user may switch to it, so row-level security applies; every transaction starts by setting whose
rows it may see (`tenancy`). `Database.owner()` is the connecting user itself, for the few
operator commands that need more than the service role may do (creating analysts' logins).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from ragservice.config import Settings
from ragservice.db import migrate, tenancy
from ragservice.db.embedded import embedded_database_url
from ragservice.db.routing import PRIMARY, ReadRouter, Replica, replica_names
from ragservice.db.scope import DeferredWrite, current_scope
from ragservice.errors import ConfigurationError, DatabaseUnavailableError

log = logging.getLogger(__name__)


_INSERT_LSN = text("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")

SERVICE_ROLE = "ragservice_service"
"""The role the service works as: bound by row-level security (migration 0007)."""

_ROLE_USABLE = text(
    "SELECT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = :role "
    "AND pg_has_role(current_user, r.oid, 'MEMBER'))"
)


@dataclass(frozen=True)
class Database:
    """The service's handle on PostgreSQL: the primary's engines and the read router."""

    url: str
    write_engine: Engine
    read_engine: Engine
    write_sessions: sessionmaker[Session]
    read_sessions: sessionmaker[Session]
    router: ReadRouter | None = None
    role: str | None = None
    """`SERVICE_ROLE` when row-level security binds this process's sessions, else None."""

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A session on the primary; commits on success, rolls back on any error.

        Within a request, the primary's WAL position after the commit becomes the response's
        consistency token."""
        session = self.write_sessions()
        try:
            with session.begin():
                yield session
            scope = current_scope()
            if scope is not None:
                scope.wrote(int(session.execute(_INSERT_LSN).scalar_one()))
        finally:
            session.close()

    @contextmanager
    def read(self, *, primary: bool = False) -> Iterator[Session]:
        """A read-only session; never commits. On a replica the router picks when the request
        allows replica reads (see `scope`) and not `primary`, else on the primary.

        `primary`: reads that must see the latest state whatever replicas lag, such as the API
        key lookup (a revoked key must stop working at once, a new one work at once)."""
        if primary:
            with self.read_sessions() as session:
                yield session
            return
        scope = current_scope()
        routed = None
        if self.router is not None and scope is not None and scope.replica_reads:
            routed = self.router.session(scope.min_lsn)
            self.router.count_read(PRIMARY if routed is None else routed[1])
        session, node = routed or (self.read_sessions(), PRIMARY)
        if scope is not None:
            scope.read_node = node
        with session:
            yield session

    def write_later(self, write: DeferredWrite) -> None:
        """A write the response need not wait for: after the response within a request (see
        `scope`), at once otherwise. Failures are logged, never raised."""
        scope = current_scope()
        if scope is not None:
            scope.deferred.append(write)
        else:
            self.run_writes([write])

    def run_writes(self, writes: Sequence[DeferredWrite]) -> None:
        """Deferred writes in one transaction on the primary; each in a savepoint when there
        are several, so one that fails is rolled back alone."""
        if not writes:
            return
        try:
            with self.write_sessions.begin() as session:
                for write in writes:
                    _run_isolated(session, write, savepoint=len(writes) > 1)
        except Exception:
            log.warning("deferred writes failed", exc_info=True)

    @contextmanager
    def owner_engine(self) -> Iterator[Engine]:
        """An engine as the connecting user itself (not the service role), on the primary:
        for operator commands only (migrations, creating roles)."""
        engine = create_engine(self.url, poolclass=NullPool, hide_parameters=True)
        try:
            yield engine
        finally:
            engine.dispose()

    @contextmanager
    def owner(self) -> Iterator[Session]:
        """A session on `owner_engine()` that sees every tenant, committed on success."""
        with self.owner_engine() as engine, Session(engine) as session, session.begin():
            tenancy.apply(session.connection(), tenancy.SYSTEM)
            yield session

    def dispose(self) -> None:
        if self.router is not None:
            self.router.stop()
            for replica in self.router.replicas:
                replica.engine.dispose()
        self.write_engine.dispose()
        self.read_engine.dispose()


def _run_isolated(session: Session, write: DeferredWrite, *, savepoint: bool) -> None:
    if not savepoint:
        write(session)
        return
    try:
        with session.begin_nested():
            write(session)
    except Exception:
        log.warning("a deferred write failed", exc_info=True)


def resolve_database_url(settings: Settings) -> str:
    """The configured URL, or the embedded server's (started on demand) when none is set."""
    if settings.database_url:
        return _with_psycopg_driver(settings.database_url.get_secret_value())
    return embedded_database_url(settings.data_dir)


def open_database(
    settings: Settings, *, run_migrations: bool = True, route_reads: bool = True
) -> Database:
    """Connect, check pgvector, bring the schema up to date, and build the session factories.

    With `RAGSERVICE_REPLICAS` set and `route_reads`, replicas are checked once here and then
    in the background, and reads go to them."""
    url = resolve_database_url(settings)
    bootstrap = create_engine(url, poolclass=NullPool, hide_parameters=True)
    try:
        check_pgvector(bootstrap)
        if run_migrations:
            migrate.upgrade(bootstrap)
        role = service_role(bootstrap, allow_missing=settings.allow_no_row_security)
    finally:
        bootstrap.dispose()
    write_engine = make_engine(url, role=role)
    read_engine = make_engine(
        url, role=role, connect_args={"options": "-c default_transaction_read_only=on"}
    )
    router = None
    if route_reads and settings.replica_urls():
        router = make_router(settings, write_engine, role=role)
        router.start()
    return Database(
        url=url,
        write_engine=write_engine,
        read_engine=read_engine,
        write_sessions=tenant_scoped(sessionmaker(write_engine, expire_on_commit=False)),
        read_sessions=tenant_scoped(sessionmaker(read_engine, expire_on_commit=False)),
        router=router,
        role=role,
    )


def service_role(engine: Engine, *, allow_missing: bool = False) -> str | None:
    """`SERVICE_ROLE` if the connecting user may work as it. Otherwise the database's own tenant
    isolation would not hold (the checks in code would): ConfigurationError, unless
    `allow_missing` (RAGSERVICE_ALLOW_NO_ROW_SECURITY), which gives None and a warning."""
    with engine.connect() as conn:
        usable = bool(conn.execute(_ROLE_USABLE, {"role": SERVICE_ROLE}).scalar_one())
    if usable:
        return SERVICE_ROLE
    problem = (
        f"row-level security is not enforced: role {SERVICE_ROLE} is missing or not granted "
        "to the database user (see docs/operators.md#tenant-isolation)"
    )
    if not allow_missing:
        raise ConfigurationError(
            f"{problem}; set RAGSERVICE_ALLOW_NO_ROW_SECURITY=1 to serve without it"
        )
    log.warning("%s; serving anyway (RAGSERVICE_ALLOW_NO_ROW_SECURITY)", problem)
    return None


def tenant_scoped(sessions: sessionmaker[Session]) -> sessionmaker[Session]:
    """Each transaction of these sessions starts by setting whose rows it may see."""
    event.listen(sessions, "after_begin", _apply_tenancy)
    return sessions


def _apply_tenancy(_session: Session, _transaction: object, connection: Connection) -> None:
    tenancy.apply(connection)


def make_router(settings: Settings, primary: Engine, *, role: str | None = None) -> ReadRouter:
    """The read router over `RAGSERVICE_REPLICAS`; not started. `role`: see `make_engine`."""
    pairs = settings.replica_urls()
    names = replica_names([region for region, _ in pairs])
    connect_args = {"connect_timeout": settings.replica_connect_timeout}
    replicas = [
        Replica(
            name,
            region,
            make_engine(_with_psycopg_driver(url), role=role, connect_args=connect_args),
        )
        for name, (region, url) in zip(names, pairs, strict=True)
    ]
    for replica in replicas:
        tenant_scoped(replica.sessions)
    return ReadRouter(
        primary,
        replicas,
        region=settings.region,
        max_lag_seconds=settings.replica_max_lag_seconds,
        wait_seconds=settings.replica_wait_seconds,
        check_seconds=settings.replica_check_seconds,
        check_timeout=settings.replica_connect_timeout + 1.0,
    )


def make_engine(url: str, *, role: str | None = None, **kwargs: Any) -> Engine:
    """An engine whose connections know the `vector` type (needed for binary COPY) and, with
    `role`, work as that role (`SET ROLE`) for as long as they live."""
    # hide_parameters: an error's message (logged, maybe shown) never carries the values sent
    # with the statement, which can be users' text or secrets.
    engine = create_engine(
        url, pool_pre_ping=True, pool_size=5, max_overflow=10, hide_parameters=True, **kwargs
    )

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        if role is not None:
            dbapi_connection.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        register_vector(dbapi_connection)
        dbapi_connection.commit()  # else the pool's first rollback would undo SET ROLE

    event.listen(engine, "connect", on_connect)
    return engine


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


def driver_connection(session: Session) -> psycopg.Connection[Any]:
    """The psycopg connection under `session`, inside the session's transaction: for COPY,
    composed SQL and statements that must not be prepared."""
    conn = session.connection().connection.driver_connection
    assert isinstance(conn, psycopg.Connection)
    return conn
