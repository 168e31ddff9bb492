"""`ragservice backup PATH` and `ragservice restore PATH`: copies of the embedded store.

Both work on the embedded PostgreSQL of RAGSERVICE_DATA_DIR; an external database
(RAGSERVICE_DATABASE_URL) is backed up with PostgreSQL's own tools (docs/operators.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

from ragservice.cli.common import console, exit_on_error, fail
from ragservice.config import get_settings

if TYPE_CHECKING:
    from ragservice.db.backup import Progress as ProgressCallback


def backup(
    path: Annotated[Path, typer.Argument(help="The backup folder to create (must not exist).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Copy the embedded store, live, to a new folder: a consistent snapshot (pg_basebackup)
    that the service may keep writing to meanwhile."""
    from ragservice.db.backup import take_backup

    data_dir = _embedded_data_dir()
    with exit_on_error(), _progress("backing up") as on_progress:
        summary = take_backup(data_dir, path, on_progress)
    if as_json:
        typer.echo(json.dumps(summary.as_json()))
        return
    console.print(
        f"backup of {data_dir} written to {summary.path}: {_size(summary.bytes)} in "
        f"{summary.files:,} files, {summary.seconds:.1f} s (PostgreSQL "
        f"{summary.postgres_version}, WAL up to {summary.end_lsn})"
    )


def restore(
    path: Annotated[Path, typer.Argument(help="A folder `ragservice backup` wrote.")],
    force: Annotated[
        bool, typer.Option("--force", help="Replace the store RAGSERVICE_DATA_DIR holds.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Make a backup the embedded store of RAGSERVICE_DATA_DIR (every process using that
    store must be stopped). Refuses to replace a store unless --force."""
    from ragservice.db.backup import restore_backup

    data_dir = _embedded_data_dir()
    if not path.is_dir():
        raise fail(f"{path} is not a folder")
    with exit_on_error(), _progress("restoring") as on_progress:
        summary = restore_backup(path, data_dir, force=force, on_progress=on_progress)
    if as_json:
        typer.echo(json.dumps(summary.as_json()))
        return
    replaced = " (the store there before is deleted)" if summary.replaced else ""
    console.print(
        f"restored {summary.backup} into {summary.pgdata}{replaced}: {_size(summary.bytes)} "
        f"in {summary.files:,} files, {summary.seconds:.1f} s"
    )


def _embedded_data_dir() -> Path:
    settings = get_settings()
    if settings.database.url is not None:
        raise fail(
            "RAGSERVICE_DATABASE_URL is set: backup and restore are for the embedded store; "
            "back up an external database with pg_dump or pg_basebackup (docs/operators.md)"
        )
    return settings.database.data_dir


@contextmanager
def _progress(label: str) -> Iterator[ProgressCallback]:
    """A progress bar on stderr (bytes copied of the total) while the work runs."""
    columns = (TextColumn(label), BarColumn(), DownloadColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(label, total=None)

        def update(done: int, total: int | None) -> None:
            progress.update(task, completed=done, total=total)

        yield update


def _size(count: int) -> str:
    return f"{count / 1024**2:,.1f} MiB"
