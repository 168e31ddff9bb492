"""Supervision of the embedded PostgreSQL by the long-running processes that hold it.

`ragservice serve` and `ragservice worker` on the embedded store (no `RAGSERVICE_DATABASE_URL`)
run an `EmbeddedSupervisor`: a thread that looks at the postmaster every
`RAGSERVICE_EMBEDDED_CHECK_SECONDS` (its `postmaster.pid`: a live `postgres` process, status
`ready`) and, when it has exited (killed by the kernel or an operator, `pg_ctl stop`), starts it
again on the same data directory. PostgreSQL's own crash recovery runs as it starts; a stale
`postmaster.pid` is PostgreSQL's to replace (or `embedded.recover_abandoned_state`'s when its
number now names another program), and backends the dead postmaster left (they hold its shared
memory, and a new one would refuse to start beside them) are ended first. The new server has
the same socket, so the service's URLs stay valid; the pools are disposed (`on_restart`) and
their pre-ping replaces any connection that survived.

Several holders never fight over the server: a restart happens under the wheel's inter-process
lock (and this module's thread lock), and a supervisor that finds a live postmaster there, one
another holder started meanwhile, adopts it instead of starting a second. Short commands
(`ingest`, `db ...`) hold the server without supervising it.

Attempts back off (`RestartBackoff`): the first at once, then 1, 2, 4 ... seconds up to
`RAGSERVICE_EMBEDDED_RESTART_MAX_BACKOFF_SECONDS` while the server keeps dying or failing to
start, back to "at once" after it has stayed up `STABLE_SECONDS`. `status()` is what readiness
and the metrics report.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil

from ragservice.config import DatabaseSettings
from ragservice.db.embedded import (
    pgdata_dir,
    pgserver,
    process_alive,
    recover_abandoned_state,
    running_postmaster,
    server_lock,
)

log = logging.getLogger(__name__)

BACKOFF_BASE_SECONDS = 1.0
STABLE_SECONDS = 60.0
"""A server up this long has recovered: the next exit is restarted at once again."""
_ORPHAN_GRACE_S = 3.0

State = Literal["running", "starting", "down", "restarting", "stopped"]
"""running: ready for connections; starting: its process runs, not ready yet (crash recovery);
down: no server (a restart is due, or backing off after a failed one); restarting: being
started by this process; stopped: not supervised any more."""


@dataclass
class RestartBackoff:
    """When the next restart attempt may run: at once after a first exit, then doubling from
    `base` to at most `maximum` seconds for each further attempt until the server has stayed
    up `stable` seconds. Pure: the caller passes the clock's readings."""

    base: float = BACKOFF_BASE_SECONDS
    maximum: float = 30.0
    stable: float = STABLE_SECONDS
    streak: int = 0
    """Restart attempts since the server was last up for `stable` seconds."""
    _last_attempt: float | None = None
    _up_since: float | None = None

    def delay(self) -> float:
        """Seconds to wait between the last attempt and the next."""
        if self.streak == 0:
            return 0.0
        return min(self.maximum, self.base * 2.0 ** min(self.streak - 1, 62))

    def due_in(self, now: float) -> float:
        """Seconds from `now` until the next attempt may run (0: now)."""
        if self._last_attempt is None:
            return 0.0
        return max(0.0, self._last_attempt + self.delay() - now)

    def attempted(self, now: float) -> None:
        """A restart was attempted at `now` (whether or not it worked)."""
        self.streak += 1
        self._last_attempt = now
        self._up_since = None

    def up(self, now: float) -> None:
        """The server was seen ready at `now`; long enough, and the streak is forgotten."""
        if self._up_since is None:
            self._up_since = now
        elif now - self._up_since >= self.stable:
            self.streak = 0
            self._last_attempt = None

    def down(self) -> None:
        """The server was seen gone: the time it was up no longer counts."""
        self._up_since = None


@dataclass(frozen=True)
class Postmaster:
    """What a look at the data directory found: the live postmaster's pid and whether it is
    ready for connections (None: no live server)."""

    pid: int | None
    ready: bool = False


@dataclass
class SupervisorStatus:
    """What the supervisor knows, for readiness and metrics."""

    state: State = "starting"
    pid: int | None = None
    exits: int = 0
    """Times the server was seen gone (by any cause) while supervised."""
    restarts: int = 0
    """Servers this process started again."""
    restart_failures: int = 0
    last_exit_at: float | None = None
    """Unix time the server was last seen gone."""
    last_restart_seconds: float | None = None
    """From seeing it gone to seeing it ready again, the last time."""
    next_attempt_in: float | None = None
    last_error: str | None = None
    _down_since: float | None = field(default=None, repr=False)

    @property
    def up(self) -> bool:
        return self.state == "running"

    def describe(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "pid": self.pid,
            "exits": self.exits,
            "restarts": self.restarts,
            "restart_failures": self.restart_failures,
            "last_exit_at": self.last_exit_at,
            "last_restart_seconds": self.last_restart_seconds,
            "next_attempt_in_seconds": self.next_attempt_in,
            "last_error": self.last_error,
        }


class EmbeddedSupervisor:
    """Watches the embedded server on `data_dir` and starts it again when it exits (see the
    module's doc). `probe` and `restart` default to the real server's; tests pass their own.
    `restart` returns True when it started a server, False when it found one running."""

    def __init__(
        self,
        data_dir: Path,
        *,
        check_seconds: float = 0.5,
        backoff: RestartBackoff | None = None,
        on_restart: Callable[[], None] | None = None,
        probe: Callable[[], Postmaster] | None = None,
        restart: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.data_dir = data_dir
        self._check_seconds = check_seconds
        self._backoff = backoff or RestartBackoff()
        self._on_restart = on_restart
        self._probe = probe or (lambda: probe_postmaster(pgdata_dir(data_dir)))
        self._restart = restart or (lambda: restart_embedded_server(data_dir))
        self._clock = clock
        self._status = SupervisorStatus()
        self._lock = threading.Lock()  # guards _status (held briefly: readiness reads it)
        self._attempting = threading.Lock()  # held through a restart: stop() waits for it
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Look once now, then every `check_seconds` on a daemon thread until `stop()`."""
        self.check_once()
        self._thread = threading.Thread(target=self._run, name="pg-supervisor", daemon=True)
        self._thread.start()
        _ACTIVE.add(self)
        atexit.register(self.stop)  # registered after the wheel's release: runs before it

    def stop(self, timeout: float = 15.0) -> None:
        """No restart from now on; waits up to `timeout` for one in progress to end.
        Idempotent; call it before the process lets go of (or stops) the server."""
        self._stopping.set()
        with self._lock:
            self._status.state = "stopped"
            self._status.next_attempt_in = None
        if self._attempting.acquire(timeout=timeout):
            self._attempting.release()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        _ACTIVE.discard(self)
        atexit.unregister(self.stop)

    def status(self) -> SupervisorStatus:
        """A copy of the current status."""
        with self._lock:
            return SupervisorStatus(**vars(self._status))

    def check_once(self) -> None:
        """One round: look at the server; restart it if it is gone and the back-off allows."""
        found = self._probe()
        now = self._clock()
        if found.pid is not None:
            self._seen_alive(found, now)
            return
        with self._attempting:
            if self._stopping.is_set():
                return
            with self._lock:
                self._seen_gone(now)
                wait = self._backoff.due_in(now)
                self._status.next_attempt_in = round(wait, 3)
                if wait > 0:
                    return
                self._backoff.attempted(now)
                self._status.state = "restarting"
            restarted = self._attempt()
        if restarted:
            self.check_once()  # ready at once, most often: say so without waiting a round

    def _seen_alive(self, found: Postmaster, now: float) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            status = self._status
            if status.pid is not None and found.pid != status.pid:
                self._seen_gone(now)  # between two looks, and already started again
            status.pid = found.pid
            status.next_attempt_in = None
            if not found.ready:
                status.state = "starting"
                return
            if status._down_since is not None:
                status.last_restart_seconds = round(now - status._down_since, 3)
                log.warning(
                    "embedded PostgreSQL is ready again (pid %d), %.1f s after it was seen gone",
                    found.pid,
                    status.last_restart_seconds,
                )
                status._down_since = None
            status.state = "running"
            self._backoff.up(now)

    def _seen_gone(self, now: float) -> None:
        status = self._status
        if status._down_since is None:
            status.exits += 1
            status.last_exit_at = time.time()
            status._down_since = now
            log.error("embedded PostgreSQL (pid %s) is gone", status.pid)
        status.state = "down"
        status.pid = None
        self._backoff.down()

    def _attempt(self) -> bool:
        """Start the server (or adopt one another holder started); False when that failed."""
        try:
            started = self._restart()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
            with self._lock:
                self._status.state = "down"
                self._status.restart_failures += 1
                self._status.last_error = error
                self._status.next_attempt_in = round(self._backoff.delay(), 3)
            log.warning(
                "starting embedded PostgreSQL again failed (attempt %d; next in %.1f s): %s",
                self._backoff.streak,
                self._backoff.delay(),
                error,
            )
            return False
        with self._lock:
            if started:
                self._status.restarts += 1
            self._status.state = "starting"
            self._status.last_error = None
            self._status.next_attempt_in = None
        if self._on_restart is not None:
            try:
                self._on_restart()
            except Exception:
                log.warning("resetting the connection pools after a restart failed", exc_info=True)
        return True

    def _run(self) -> None:
        while not self._stopping.wait(self._check_seconds):
            try:
                self.check_once()
            except Exception:  # never let the watch die
                log.warning("supervising embedded PostgreSQL: a check failed", exc_info=True)


def supervise_embedded(
    database: DatabaseSettings, on_restart: Callable[[], None] | None = None
) -> EmbeddedSupervisor | None:
    """A started supervisor of the embedded server this process holds, or None when there is
    none to watch (`RAGSERVICE_DATABASE_URL` set) or `RAGSERVICE_EMBEDDED_SUPERVISE` is off."""
    if database.url or not database.embedded_supervise:
        return None
    supervisor = EmbeddedSupervisor(
        database.data_dir,
        check_seconds=database.embedded_check_seconds,
        backoff=RestartBackoff(maximum=database.embedded_restart_max_backoff_seconds),
        on_restart=on_restart,
    )
    supervisor.start()
    return supervisor


_ACTIVE: set[EmbeddedSupervisor] = set()


def stop_all(timeout: float = 15.0) -> None:
    """Stop every supervisor of this process (for a shutdown that stops the server itself)."""
    for supervisor in list(_ACTIVE):
        supervisor.stop(timeout)


def probe_postmaster(pgdata: Path) -> Postmaster:
    """The live postmaster on `pgdata`, per its `postmaster.pid`, and whether it is ready."""
    process = running_postmaster(pgdata)
    if process is None or not process_alive(process):
        return Postmaster(None)
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except OSError:
        return Postmaster(None)
    ready = len(lines) >= 8 and lines[7].strip() == "ready"
    return Postmaster(process.pid, ready=ready)


_THREAD_LOCK = threading.Lock()
"""The wheel's lock is a file lock: per process, not per thread."""


def restart_embedded_server(data_dir: Path) -> bool:
    """Start the embedded server on `data_dir` again for this process's handle on it; True when
    this call started it, False when a live one was there (another holder started it)."""
    pgdata = pgdata_dir(data_dir)
    server = pgserver().PostgresServer._instances.get(pgdata)
    if server is None:
        raise RuntimeError("this process does not hold the embedded server any more")
    with _THREAD_LOCK:
        recover_abandoned_state(pgdata)
        with server_lock():
            found = running_postmaster(pgdata)
            started = found is None or not process_alive(found)
            if started:
                end_orphaned_backends(pgdata)
                if found is not None:
                    _clear_dead_postmaster(found, pgdata)
                log.info("starting embedded PostgreSQL in %s (crash recovery runs first)", pgdata)
            server._postmaster_info = None
            server.ensure_postgres_running()  # joins a running server, else pg_ctl start -w
    return started


def end_orphaned_backends(pgdata: Path) -> list[int]:
    """End the PostgreSQL processes a dead postmaster left running on `pgdata` (they work in
    the data directory, and would keep a new postmaster from starting): SIGQUIT, as a
    postmaster does to its children after a crash, then SIGKILL."""
    orphans = [
        p for p in psutil.process_iter(["name"]) if _is_orphan_of(p, pgdata) and process_alive(p)
    ]
    if not orphans:
        return []
    for process in orphans:
        with contextlib.suppress(psutil.Error):
            process.send_signal(signal.SIGQUIT)
    deadline = time.monotonic() + _ORPHAN_GRACE_S
    while time.monotonic() < deadline and any(process_alive(p) for p in orphans):
        time.sleep(0.05)
    for process in orphans:
        with contextlib.suppress(psutil.Error):
            if process_alive(process):
                process.kill()
    log.warning("ended %d PostgreSQL processes the dead postmaster left", len(orphans))
    return [p.pid for p in orphans]


def _clear_dead_postmaster(process: psutil.Process, pgdata: Path) -> None:
    """The killed postmaster is a zombie until its parent reaps it, and PostgreSQL takes the
    number in its lock files (`postmaster.pid`, the socket's `.lock`) for a live server's.
    Reap it if it is this process's child; else (its backends are ended: nothing uses the data
    directory any more) remove those lock files."""
    if process.ppid() == os.getpid():
        with contextlib.suppress(ChildProcessError):
            os.waitpid(process.pid, os.WNOHANG)
    if not psutil.pid_exists(process.pid):
        return
    log.info("embedded PostgreSQL: removing the lock files of dead postmaster %d", process.pid)
    pid_file = pgdata / "postmaster.pid"
    try:
        lines = pid_file.read_text().splitlines()
    except OSError:
        lines = []
    if len(lines) >= 5 and lines[3].strip().isdigit() and lines[4].strip():
        socket_lock = Path(lines[4].strip()) / f".s.PGSQL.{lines[3].strip()}.lock"
        socket_lock.unlink(missing_ok=True)
    pid_file.unlink(missing_ok=True)


def _is_orphan_of(process: psutil.Process, pgdata: Path) -> bool:
    if process.info["name"] != "postgres" or process.pid == os.getpid():
        return False
    try:
        return Path(process.cwd()) == pgdata
    except psutil.Error:
        return False
