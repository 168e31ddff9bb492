"""`ragservice sync PATH -c NAME [--watch]`: keep a collection the mirror of a folder.

The folder is a source of the collection (found by its absolute path, or added, with pruning
on): a run ingests what is new or changed and deletes the documents of files that are gone.
With `--watch` the command then follows the folder (watchfiles; a burst of changes is one
batch) and runs the source again after each batch, printing a line per run, until Ctrl-C.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from ragservice.cli.common import cli_actor, console, exit_on_error
from ragservice.cli.source_runs import (
    EXIT_INTERRUPTED,
    ReaderFlags,
    folder_location,
    print_report,
    report_line,
    report_ok,
    run_here,
    tenant_runtime,
)
from ragservice.config import DEFAULT_TENANT_NAME

if TYPE_CHECKING:
    from ingest.sources.sync import SyncReport

DEBOUNCE_MS = 800
"""The longest a batch of changes is gathered before the run: a burst (a `git checkout`, a
copy of many files) is one run, and one change still runs within a second."""
_QUIET_MS = 100
"""A batch ends once the folder was quiet this long."""
_FIRST_RUN_TIMEOUT_MS = 300
"""The watcher answers this soon even with no changes (an empty batch, skipped after the first),
so that the first run starts once the folder is watched: a change made while it runs is not
missed."""


def new_stop_event() -> threading.Event:
    """The event that ends `--watch` (tests set it; people press Ctrl-C)."""
    return threading.Event()


def sync_command(
    path: Annotated[Path, typer.Argument(help="The folder (walked recursively).")],
    collection: Annotated[str, typer.Option("--collection", "-c", help="Target collection.")],
    watch: Annotated[
        bool,
        typer.Option("--watch", help="Keep following the folder, running again on changes."),
    ] = False,
    include: Annotated[
        list[str] | None, typer.Option("--include", help="Glob of files to take (repeatable).")
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option("--exclude", help="Glob of files to skip (repeatable).")
    ] = None,
    tenant: Annotated[
        str, typer.Option("--tenant", help="The tenant (by name) the documents are for.")
    ] = DEFAULT_TENANT_NAME,
) -> None:
    """Make the collection mirror a folder: new and changed files ingested, documents of
    deleted files deleted. With --watch, again after each change, until Ctrl-C."""
    from ragservice.services.callers import Operator
    from ragservice.services.sources import SourceSpec, find_or_add_source

    location = folder_location(str(path), "PATH")
    options = ReaderFlags(include=tuple(include or ()), exclude=tuple(exclude or ())).options()
    spec = SourceSpec(location=location, options=options, prune=True)
    with exit_on_error(), tenant_runtime(tenant) as (opened, tenant_id):
        operator = Operator(tenant_id=tenant_id, actor=cli_actor())
        source = find_or_add_source(
            opened.db, opened.settings, operator, collection, spec, operator=True
        )
        _note_changed_options(source.options, options)

        def run_once() -> SyncReport:
            return run_here(opened, tenant_id, collection, source, transient=watch)

        if not watch:
            report = run_once()
        else:
            code = watch_folder(Path(location), source.id, run_once, stop_event=new_stop_event())
            raise typer.Exit(code)
    print_report(report, f"sync {location}")
    raise typer.Exit(0 if report_ok(report) else 1)


def watch_folder(
    folder: Path,
    source_id: uuid.UUID,
    run_once: Callable[[], SyncReport],
    *,
    stop_event: threading.Event,
    max_runs: int | None = None,
) -> int:
    """Run once, then again after each batch of changes under `folder`, a line per run, until
    `stop_event` is set, `max_runs` runs were made, or Ctrl-C (status 130). A run that fails
    as a whole is a line too: the next change tries again."""
    import watchfiles

    runs = 0
    console.print(f"watching {escape(str(folder))} (source {source_id}); Ctrl-C stops")
    interrupted = threading.Event()
    try:
        with _ctrl_c_stops(stop_event, interrupted):
            for changes in watchfiles.watch(
                folder,
                debounce=DEBOUNCE_MS,
                step=_QUIET_MS,
                stop_event=stop_event,
                rust_timeout=_FIRST_RUN_TIMEOUT_MS,
                yield_on_timeout=True,
                raise_interrupt=True,
            ):
                if runs > 0 and not changes:
                    continue  # the watcher's timeout, not a change
                _run_and_report(run_once, len(changes))
                runs += 1
                if max_runs is not None and runs >= max_runs:
                    break
    except KeyboardInterrupt:
        interrupted.set()
    console.print(f"stopped after {runs} run(s)")
    return EXIT_INTERRUPTED if interrupted.is_set() else 0


@contextmanager
def _ctrl_c_stops(stop_event: threading.Event, interrupted: threading.Event) -> Iterator[None]:
    """While watching (in the main thread), Ctrl-C sets `stop_event` before it raises
    KeyboardInterrupt: the watcher checks the event every step, so the loop ends even where
    the KeyboardInterrupt itself is consumed on its way (seen on a busy machine: a Ctrl-C
    sent as a run ended left the command watching)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_ctrl_c(signum: int, frame: FrameType | None) -> None:
        interrupted.set()
        stop_event.set()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _run_and_report(run_once: Callable[[], SyncReport], changes: int) -> None:
    from ragservice.errors import RagServiceError

    stamp = time.strftime("%H:%M:%S")
    why = f"{changes} change(s)" if changes else "first run"
    try:
        report = run_once()
    except RagServiceError as exc:
        console.print(f"{stamp} [red]run failed[/red] ({why}): {escape(str(exc))}")
        return
    console.print(f"{stamp} ran ({why}): {escape(report_line(report))}")


def _note_changed_options(stored: dict[str, object], asked: dict[str, object]) -> None:
    """The folder's source was added before with other options: say that those stay."""
    if asked and stored != asked:
        console.print(
            "note: this folder's source keeps the options it was added with "
            f"({escape(str(stored or 'none'))}); `ragservice sources remove` it to change them"
        )
