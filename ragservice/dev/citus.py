"""A Citus cluster of the embedded PostgreSQL on loopback: a coordinator and workers, for
local use and tests.

Each node is its own data directory under `data_dir/citus/<name>` made by `initdb`, started by
`pg_ctl` with `shared_preload_libraries = 'citus'`, listening on 127.0.0.1 (the nodes reach each
other over TCP, trusted on loopback only) and on a Unix socket. Every node gets the `ragservice`
database with the `citus` and `vector` extensions; the coordinator registers itself and the
workers (`citus_set_coordinator_host`, `citus_add_node`). The service then connects to the
coordinator and `ragservice db distribute` spreads the store over the workers.

Citus must be installed into the embedded PostgreSQL first: no Debian or PyPI package carries it
for PostgreSQL 18, so a person (or the test suite) runs Citus's own installer or builds it
(`citus_installed()` says whether it is there). Production deployments use Citus's packages or
its official image instead (docker-compose.yml's `citus` profile, docs/scaling.md).

Like `DevCluster`, when this process is root every `pg_*` program runs as the system user
`pgserver` and the data directories belong to it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg

from ragservice.db.embedded import DATABASE_NAME, postgres_bin_dir
from ragservice.db.engine import SERVICE_LOGIN, ensure_service_login
from ragservice.dev.server_process import (
    ServerProcess,
    prepare_private_dir,
    run_pg,
    socket_dir_for,
)
from ragservice.errors import ConfigurationError, DatabaseUnavailableError

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
EXTENSIONS = ("citus", "vector")
"""Made in every node's database, Citus first (it must be the first extension loaded)."""

# Written into each node's postgresql.conf (the nodes are development servers: small, no fsync).
_NODE_SETTINGS = {
    "shared_preload_libraries": "'citus'",
    "listen_addresses": f"'{LOOPBACK}'",
    "max_connections": "300",
    "shared_buffers": "128MB",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    # Shard moves and splits without blocking writes copy through logical replication.
    "wal_level": "logical",
    "max_replication_slots": "20",
    "max_wal_senders": "20",
    # Each node runs few queries at once on a small machine: no parallel workers per shard.
    "max_parallel_workers_per_gather": "0",
    # The transaction's SET LOCAL settings (tenant, readers) reach the workers (tenancy).
    "citus.propagate_set_commands": "'local'",
    "citus.shard_count": "8",
    "citus.log_remote_commands": "off",
}


def citus_installed(bin_dir: Path | None = None) -> bool:
    """Whether the PostgreSQL in `bin_dir` (the embedded one by default) has Citus installed."""
    pg_config = (bin_dir or postgres_bin_dir()) / "pg_config"
    try:
        libdir = subprocess.run(
            [str(pg_config), "--pkglibdir"], capture_output=True, text=True, check=True
        ).stdout.strip()
        sharedir = subprocess.run(
            [str(pg_config), "--sharedir"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return False
    return (Path(libdir) / "citus.so").exists() and (
        Path(sharedir) / "extension" / "citus.control"
    ).exists()


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


@dataclass
class CitusNode(ServerProcess):
    """One node of the cluster: a data directory, a TCP port on loopback and a Unix socket."""

    KIND = "citus node"

    name: str
    data_dir: Path
    port: int
    socket_dir: Path

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the node's `ragservice` database, as `postgres`, over TCP."""
        return f"postgresql+psycopg://postgres@{LOOPBACK}:{self.port}/{DATABASE_NAME}"

    @property
    def conninfo(self) -> str:
        return f"host={LOOPBACK} port={self.port} user=postgres dbname={DATABASE_NAME}"

    def server_options(self) -> str:
        return f"-p {self.port} -k {self.socket_dir}"

    def ready_conninfo(self) -> str:
        return f"host={LOOPBACK} port={self.port} user=postgres dbname=postgres"

    def init(self) -> None:
        """`initdb` the data directory (trust on loopback and the socket) and write the
        settings; no-op when it holds a cluster already."""
        if self.has_data():
            return
        if self.data_dir.exists():
            shutil.rmtree(self.data_dir)  # an interrupted initdb
        prepare_private_dir(self.data_dir)
        returncode, output = run_pg(
            "initdb",
            [
                "-D",
                str(self.data_dir),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--locale=C.UTF-8",
            ],
            timeout=120,
        )
        if returncode != 0:
            raise DatabaseUnavailableError(f"initdb of {self.name} failed: {output.strip()}")
        settings = "\n".join(f"{key} = {value}" for key, value in _NODE_SETTINGS.items())
        conf = self.data_dir / "postgresql.conf"
        conf.write_text(conf.read_text() + f"\n# ragservice dev citus\n{settings}\n")

    def start(self) -> None:
        """Start the node (no-op when it runs) and wait until it accepts connections."""
        self.start_server()

    def prepare_database(self) -> None:
        """The `ragservice` database with Citus and pgvector (idempotent)."""
        admin = f"host={LOOPBACK} port={self.port} user=postgres dbname=postgres"
        with psycopg.connect(admin, autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)
            ).fetchone()
            if exists is None:
                conn.execute(f"CREATE DATABASE {DATABASE_NAME}")
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            for extension in EXTENSIONS:
                conn.execute(f"CREATE EXTENSION IF NOT EXISTS {extension}")


class CitusCluster:
    """A coordinator and `workers` workers in `data_dir/citus`, on loopback ports.

    Ports: `first_port` for the coordinator and the next ones for the workers, or free ports
    picked at start when `first_port` is None (tests)."""

    def __init__(self, data_dir: Path, *, workers: int = 2, first_port: int | None = None) -> None:
        if workers < 1:
            raise ConfigurationError("a Citus cluster needs at least one worker")
        self.root = data_dir.resolve() / "citus"
        self._first_port = first_port
        self.coordinator = self._node("coordinator", 0)
        self.workers = [self._node(f"worker{i}", i) for i in range(1, workers + 1)]

    def _node(self, name: str, index: int) -> CitusNode:
        port = free_port() if self._first_port is None else self._first_port + index
        data_dir = self.root / name
        return CitusNode(name, data_dir, port, socket_dir_for(data_dir, port))

    @property
    def nodes(self) -> list[CitusNode]:
        return [self.coordinator, *self.workers]

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the coordinator's `ragservice` database: the service's."""
        return self.coordinator.url

    def start(self) -> None:
        """Make the missing nodes, start them all and register the workers (idempotent)."""
        if not citus_installed():
            raise ConfigurationError(
                "Citus is not installed in the embedded PostgreSQL "
                f"({postgres_bin_dir()}); install it (docs/scaling.md#a-local-cluster)"
            )
        atexit.register(self.stop)
        for node in self.nodes:
            node.init()
            node.start()
            node.prepare_database()
        with self.coordinator_connection() as conn:
            conn.execute(
                "SELECT citus_set_coordinator_host(%s, %s)", (LOOPBACK, self.coordinator.port)
            )
            for worker in self.workers:
                self._register(conn, worker)
        log.info("citus cluster started: coordinator + %d workers", len(self.workers))

    @property
    def service_url(self) -> str:
        """The coordinator as the service's own login (`SERVICE_LOGIN`: no superuser, bound
        by row-level security), which `prepare_store()` makes."""
        return self.url.replace("//postgres@", f"//{SERVICE_LOGIN}@", 1)

    def prepare_store(self) -> str:
        """Migrate the store on the coordinator and make the service's login; its URL."""
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        from ragservice.db import migrate

        engine = create_engine(self.url, poolclass=NullPool, hide_parameters=True)
        try:
            migrate.upgrade(engine)
            ensure_service_login(engine)
        finally:
            engine.dispose()
        return self.service_url

    def add_worker(self) -> CitusNode:
        """One more worker, started and registered (its shards come with a rebalance)."""
        node = self._node(f"worker{len(self.workers) + 1}", len(self.workers) + 1)
        node.init()
        node.start()
        node.prepare_database()
        self.workers.append(node)
        with self.coordinator_connection() as conn:
            self._register(conn, node)
        return node

    @staticmethod
    def _register(conn: psycopg.Connection[Any], node: CitusNode) -> None:
        known = conn.execute(
            "SELECT 1 FROM pg_dist_node WHERE nodename = %s AND nodeport = %s",
            (LOOPBACK, node.port),
        ).fetchone()
        if known is None:
            conn.execute("SELECT citus_add_node(%s, %s)", (LOOPBACK, node.port))

    @contextlib.contextmanager
    def coordinator_connection(self) -> Iterator[psycopg.Connection[Any]]:
        with psycopg.connect(self.coordinator.conninfo, autocommit=True) as conn:
            yield conn

    def stop(self) -> None:
        """Stop the workers, then the coordinator."""
        atexit.unregister(self.stop)
        for node in [*self.workers, self.coordinator]:
            try:
                node.stop()
            except DatabaseUnavailableError as exc:
                log.error("%s", exc)

    def destroy(self) -> None:
        """Stop every node and delete their data."""
        self.stop()
        for node in self.nodes:
            shutil.rmtree(node.data_dir, ignore_errors=True)
            if node.socket_dir != node.data_dir:
                shutil.rmtree(node.socket_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.root.rmdir()

    def __enter__(self) -> CitusCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
