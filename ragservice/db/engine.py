"""Engines and session factories; the one place that decides which node a session is on.

`Database.write()` is always on the primary. `Database.read()` within a request that only reads
goes where `routing.ReadRouter` says (a healthy, current replica, else the primary) and honours
the request's consistency token (`scope.RequestScope`); every other read is on the primary.
Sessions on the primary for reads are read-only, like a replica's, so a write slipped into a
read fails in every deployment, not only in those with replicas.

Every connection works as the `ragservice_service` role (migration 0007) when the connecting
user may switch to it, so row-level security applies; every transaction starts by setting whose
rows it may see (`tenancy`). `Database.owner()` is the owner's login (`owner_url`), for the few
operator commands that need more than the service role may do (migrations, analysts' logins).

The service's own login should be able to do nothing more than those roles: not a superuser,
not BYPASSRLS, not the tables' owner (any of those could `RESET ROLE` out of row-level security).
The embedded server gets such a login (`SERVICE_LOGIN`) made for it; elsewhere the operator
makes one (docs/operators.md#tenant-isolation) and `ragservice serve` refuses a privileged one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from ragservice.config import DatabaseSettings, ReplicationSettings, Settings
from ragservice.db import migrate, tenancy
from ragservice.db.embedded import embedded_database_url
from ragservice.db.routing import PRIMARY, ReadRouter, Replica, replica_names
from ragservice.db.scope import DeferredWrite, current_scope
from ragservice.db.vector_types import VectorTypes
from ragservice.errors import ConfigurationError, DatabaseUnavailableError

log = logging.getLogger(__name__)


_INSERT_LSN = text("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")

SERVICE_ROLE = "ragservice_service"
"""The role the service works as: bound by row-level security (migration 0007)."""
SERVICE_LOGIN = "ragservice_app"
"""The login the service uses on the embedded server: a member of the two roles, nothing more."""

_ROLES_USABLE = text(
    "SELECT count(*) = 2 FROM pg_roles r WHERE r.rolname IN (:service, :system) "
    "AND pg_has_role(session_user, r.oid, 'MEMBER')"
)
# Whether the login could leave row-level security behind (RESET ROLE, or ignore it outright).
_LOGIN_PRIVILEGE = text(
    "SELECT CASE WHEN r.rolsuper THEN 'a superuser' WHEN r.rolbypassrls THEN 'BYPASSRLS' "
    "WHEN pg_has_role(session_user, c.relowner, 'MEMBER') THEN 'the tables'' owner' END "
    "FROM pg_roles r LEFT JOIN pg_class c ON c.oid = to_regclass('public.documents') "
    "WHERE r.rolname = session_user"
)


@dataclass(frozen=True)
class Database:
    """The service's handle on PostgreSQL: the primary's engines and the read router."""

    url: str
    owner_url: str
    write_engine: Engine
    read_engine: Engine
    write_sessions: sessionmaker[Session]
    read_sessions: sessionmaker[Session]
    router: ReadRouter | None = None
    role: str | None = None
    """`SERVICE_ROLE` when row-level security binds this process's sessions, else None."""
    privileged_login: str | None = None
    """How the service's login could leave row-level security ("a superuser", ...), or None."""

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
        except Exception as exc:
            log.error("%d deferred writes failed: %s", len(writes), error_summary(exc))

    @contextmanager
    def owner_engine(self) -> Iterator[Engine]:
        """An engine as the owner's login (not the service role), on the primary: for
        operator commands only (migrations, creating roles)."""
        engine = create_engine(self.owner_url, poolclass=NullPool, hide_parameters=True)
        try:
            yield engine
        finally:
            engine.dispose()

    @contextmanager
    def owner(self) -> Iterator[Session]:
        """A session on `owner_engine()` that sees every tenant, committed on success."""
        with self.owner_engine() as engine, Session(engine) as session, session.begin():
            # The owner sees every row without switching (row-level security does not bind it).
            tenancy.apply(session.connection(), tenancy.SYSTEM, switch_role=False)
            yield session

    def engines(self) -> list[Engine]:
        """Every engine of the service's login: the primary's two and each replica's."""
        replicas = [] if self.router is None else [r.engine for r in self.router.replicas]
        return [self.write_engine, self.read_engine, *replicas]

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
    except Exception as exc:
        log.error("a deferred write failed: %s", error_summary(exc))


def error_summary(exc: BaseException) -> str:
    """A database error as a log line may name it: its class and SQLSTATE, never its message.

    PostgreSQL's message quotes the values it refused (`CONTEXT: JSON data, line 1: ...`):
    users' questions and conversations, which stay out of the logs. (The engines' own messages
    leave out the statements' parameters: `hide_parameters`.)"""
    cause = getattr(exc, "orig", None) or exc
    sqlstate = getattr(cause, "sqlstate", None)
    name = (
        f"{type(exc).__name__} ({type(cause).__name__})" if cause is not exc else type(exc).__name__
    )
    return f"{name}, SQLSTATE {sqlstate}" if sqlstate else name


def resolve_database_url(database: DatabaseSettings) -> str:
    """The configured URL, or the embedded server's (started on demand) when none is set."""
    if database.url:
        return _with_psycopg_driver(database.url.get_secret_value())
    return embedded_database_url(database.data_dir)


def resolve_owner_url(database: DatabaseSettings, service_url: str) -> str:
    """The owner's login: `RAGSERVICE_OWNER_DATABASE_URL`, else the service's own URL (the
    embedded server's administrator when none is configured)."""
    if database.owner_url:
        return _with_psycopg_driver(database.owner_url.get_secret_value())
    return service_url


def ensure_service_login(owner: Engine) -> None:
    """`SERVICE_LOGIN` with the two roles, for the embedded server (local connections only: the
    embedded server trusts those, so the login needs no password)."""
    roles = sql.SQL(", ").join(map(sql.Identifier, (SERVICE_ROLE, tenancy.SYSTEM_ROLE)))
    login = sql.Identifier(SERVICE_LOGIN)
    with owner.connect() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('ragservice_app login'))"))
        exists = conn.execute(
            text("SELECT 1 FROM pg_roles WHERE rolname = :n"), {"n": SERVICE_LOGIN}
        )
        if exists.first() is None:
            raw = driver_connection_of(conn)
            raw.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOBYPASSRLS").format(login))
            raw.execute(sql.SQL("GRANT {} TO {}").format(roles, login))
        conn.commit()


def open_database(
    settings: Settings, *, run_migrations: bool = True, route_reads: bool = True
) -> Database:
    """Connect, check pgvector, bring the schema up to date, and build the session factories.

    With `RAGSERVICE_REPLICAS` set and `route_reads`, replicas are checked once here and then
    in the background, and reads go to them."""
    url = resolve_database_url(settings.database)
    owner_url = resolve_owner_url(settings.database, url)
    bootstrap = create_engine(owner_url, poolclass=NullPool, hide_parameters=True)
    try:
        check_pgvector(bootstrap)
        if run_migrations:
            _migrate(bootstrap)
        if not settings.database.url:
            ensure_service_login(bootstrap)
            url = (
                make_url(url)
                .set(username=SERVICE_LOGIN, password=None)
                .render_as_string(hide_password=False)
            )
    finally:
        bootstrap.dispose()
    role, privileged = _check_login(url, allow_missing=settings.security.allow_no_row_security)
    write_engine = make_engine(url, role=role)
    read_engine = make_engine(
        url, role=role, connect_args={"options": "-c default_transaction_read_only=on"}
    )
    router = None
    if route_reads and settings.replication.replica_urls():
        router = make_router(settings.replication, write_engine, role=role)
        router.start()
    return Database(
        url=url,
        owner_url=owner_url,
        write_engine=write_engine,
        read_engine=read_engine,
        write_sessions=tenant_scoped(sessionmaker(write_engine, expire_on_commit=False), role=role),
        read_sessions=tenant_scoped(sessionmaker(read_engine, expire_on_commit=False), role=role),
        router=router,
        role=role,
        privileged_login=privileged,
    )


def _migrate(owner: Engine) -> None:
    try:
        migrate.upgrade(owner)
    except ProgrammingError as exc:
        if not isinstance(exc.orig, psycopg.errors.InsufficientPrivilege):
            raise
        raise ConfigurationError(
            "the database schema needs migrating and this login may not do it: run "
            "`ragservice db upgrade` with the owner's URL (RAGSERVICE_OWNER_DATABASE_URL)"
        ) from exc


def _check_login(url: str, *, allow_missing: bool) -> tuple[str | None, str | None]:
    """The service's login on `url`: (`SERVICE_ROLE` or None, how it is privileged or None)."""
    engine = create_engine(url, poolclass=NullPool, hide_parameters=True)
    try:
        with engine.connect() as conn:
            params = {"service": SERVICE_ROLE, "system": tenancy.SYSTEM_ROLE}
            usable = bool(conn.execute(_ROLES_USABLE, params).scalar_one())
            privileged = conn.execute(_LOGIN_PRIVILEGE).scalar()
    finally:
        engine.dispose()
    return service_role(usable, allow_missing=allow_missing), privileged


def service_role(usable: bool, *, allow_missing: bool = False) -> str | None:
    """`SERVICE_ROLE` if the login may work as it (and as the system role). Otherwise the
    database's own tenant isolation would not hold (the checks in code would):
    ConfigurationError, unless `allow_missing` (RAGSERVICE_ALLOW_NO_ROW_SECURITY), which gives
    None and a warning."""
    if usable:
        return SERVICE_ROLE
    problem = (
        f"row-level security is not enforced: role {SERVICE_ROLE} or {tenancy.SYSTEM_ROLE} is "
        "missing or not granted to the database user (see docs/operators.md#tenant-isolation)"
    )
    if not allow_missing:
        raise ConfigurationError(
            f"{problem}; set RAGSERVICE_ALLOW_NO_ROW_SECURITY=1 to serve without it"
        )
    log.warning("%s; serving anyway (RAGSERVICE_ALLOW_NO_ROW_SECURITY)", problem)
    return None


def tenant_scoped(sessions: sessionmaker[Session], *, role: str | None) -> sessionmaker[Session]:
    """Each transaction of these sessions starts by setting whose rows it may see. `role`:
    the role the sessions' connections work as (None: no row-level security)."""

    def apply_tenancy(_session: Session, _transaction: object, connection: Connection) -> None:
        tenancy.apply(connection, switch_role=role is not None)

    event.listen(sessions, "after_begin", apply_tenancy)
    return sessions


def make_router(
    replication: ReplicationSettings, primary: Engine, *, role: str | None = None
) -> ReadRouter:
    """The read router over `RAGSERVICE_REPLICAS`; not started. `role`: see `make_engine`."""
    pairs = replication.replica_urls()
    names = replica_names([region for region, _ in pairs])
    connect_args = {"connect_timeout": replication.connect_timeout}
    replicas = [
        Replica(
            name,
            region,
            make_engine(_with_psycopg_driver(url), role=role, connect_args=connect_args),
        )
        for name, (region, url) in zip(names, pairs, strict=True)
    ]
    for replica in replicas:
        tenant_scoped(replica.sessions, role=role)
    return ReadRouter(
        primary,
        replicas,
        region=replication.region,
        max_lag_seconds=replication.max_lag_seconds,
        wait_seconds=replication.wait_seconds,
        check_seconds=replication.check_seconds,
        check_timeout=replication.connect_timeout + 1.0,
    )


def make_engine(url: str, *, role: str | None = None, **kwargs: Any) -> Engine:
    """An engine whose connections know the `vector` type (needed for binary COPY) and, with
    `role`, work as that role (`SET ROLE`) for as long as they live."""
    # hide_parameters: an error's message (logged, maybe shown) never carries the values sent
    # with the statement, which can be users' text or secrets. The pool keeps 10 connections:
    # with 5, sixteen clients opened a new connection (a new PostgreSQL backend) for about one
    # request in three, since connections beyond the pool's size are closed when returned.
    engine = create_engine(
        url, pool_pre_ping=True, pool_size=10, max_overflow=10, hide_parameters=True, **kwargs
    )

    # Described once per engine: a new connection copies the types (db/vector_types.py says why).
    vector_types = VectorTypes()
    vector_types.install(engine)

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        if role is not None:
            dbapi_connection.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        vector_types.register(dbapi_connection)
        _sequential_on_citus(dbapi_connection)
        dbapi_connection.commit()  # else the pool's first rollback would undo SET ROLE

    event.listen(engine, "connect", on_connect)
    return engine


IS_CITUS = "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"
"""Whether the database has Citus (a coordinator of a distributed store)."""


def _sequential_on_citus(dbapi_connection: Any) -> None:
    """On a Citus coordinator, run a transaction's multi-shard statements over one connection
    a worker: the job queue stays on the coordinator and refers to a reference table, and Citus
    refuses to write it after a parallel statement on a distributed table in the same
    transaction ("cannot modify table ingest_jobs because there was a parallel operation").
    A tenant's statements go to one shard and are not affected."""
    if dbapi_connection.execute(IS_CITUS).fetchone()[0]:
        dbapi_connection.execute("SET citus.multi_shard_modify_mode = 'sequential'")


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


def driver_connection_of(conn: Connection) -> psycopg.Connection[Any]:
    """The psycopg connection under a SQLAlchemy connection (for composed SQL)."""
    raw = conn.connection.driver_connection
    assert isinstance(raw, psycopg.Connection)
    return raw


def driver_connection(session: Session) -> psycopg.Connection[Any]:
    """The psycopg connection under `session`, inside the session's transaction: for COPY,
    composed SQL and statements that must not be prepared."""
    return driver_connection_of(session.connection())
