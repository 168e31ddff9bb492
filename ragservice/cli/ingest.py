"""The batch ingest command: `ragservice ingest PATH... -c NAME`, also `python -m ingest`.

The output goes to stderr; the exit status is non-zero when any input failed (files skipped,
of a type no loader reads, are listed but fail nothing), and 130 when the user pressed Ctrl-C
(SIGINT), even after the last batch had committed. SIGTERM (and SIGHUP) stop the run the same
way, with status 143.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from ragservice.cli.source_runs import (
    CrawlOption,
    DepthOption,
    EndpointUrlOption,
    MaxPagesOption,
    ProfileOption,
    RemoteIngest,
    check_remote_ingest,
    ingest_locations,
    tenant_id_of,
)
from ragservice.config import DEFAULT_TENANT_NAME, get_settings
from ragservice.errors import (
    InvalidInputError,
    PermissionDeniedError,
    RagServiceError,
)
from ragservice.observability.logs import configure_logging
from ragservice.readers import parse_readers

if TYPE_CHECKING:
    from ingest.loaders import JsonlFields, ParquetColumns
    from ingest.pipeline import IngestReport, ProgressCallback
    from ragservice.embedding.indexing import IndexBuild
    from ragservice.embedding.indexing import Progress as IndexProgress
    from ragservice.runtime import Runtime

console = Console(stderr=True)
log = logging.getLogger(__name__)

_MAX_FAILURES_SHOWN = 20
"""Failures (and skipped files) the summary lists; `--json` lists them all."""

if TYPE_CHECKING:
    Runner = Callable[[ProgressCallback, IngestReport], IngestReport]

EXIT_INTERRUPTED = 130  # the shell's status for a command stopped by SIGINT (128 + 2)


class _CtrlC:
    """The SIGINT (and SIGTERM) handler while the command runs.

    The first SIGINT stops the run (KeyboardInterrupt) as long as it is still `stopping`, that
    is until the pipeline returns; the pipeline then keeps the batches that committed, whole.
    A SIGINT after that (the job record, the summary) interrupts nothing, and a second one
    does not break the clean-up of the first: both are only noted in `received`, so that the
    command exits 130 whenever the user pressed Ctrl-C.
    """

    def __init__(self) -> None:
        self.received = False
        self.stopping = True
        self.signum = signal.SIGINT

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        first = not self.received
        self.received = True
        if first:
            self.signum = signal.Signals(signum)
        if first and self.stopping:
            raise KeyboardInterrupt

    @property
    def exit_status(self) -> int:
        return 128 + self.signum  # the shell's status for a command the signal stopped

    @property
    def name(self) -> str:
        return "Ctrl-C" if self.signum == signal.SIGINT else self.signum.name


def ingest_command(
    paths: Annotated[
        list[str],
        typer.Argument(
            help="Files or folders (walked recursively), or web pages (https://…) or S3 "
            "prefixes (s3://bucket/prefix), each read as the collection's source for it."
        ),
    ],
    collection: Annotated[str, typer.Option("--collection", "-c", help="Target collection.")],
    include: Annotated[
        list[str] | None, typer.Option("--include", help="Glob of files to take (repeatable).")
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option("--exclude", help="Glob of files to skip (repeatable).")
    ] = None,
    jsonl_fields: Annotated[
        str | None,
        typer.Option(
            "--jsonl-fields",
            help="JSONL field mapping, e.g. 'id=doc_id,title=name,text=body,metadata=lang|year'. "
            "Default: BEIR style _id/title/text.",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Parse, chunk and compare; write nothing.")
    ] = False,
    prune: Annotated[
        bool,
        typer.Option("--prune", help="Delete documents of the collection that are not in PATHs."),
    ] = False,
    parquet_columns: Annotated[
        str | None,
        typer.Option(
            "--parquet-columns",
            help="Parquet column mapping, e.g. 'id=doc,text=passage,embedding=vec'. Default: "
            "id/title/text/embedding/ordinal/metadata/document_metadata.",
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="NAME[:VERSION] the imported vectors are for (their dimension is checked). "
            "Default: the active model.",
        ),
    ] = None,
    index: Annotated[
        str,
        typer.Option(
            "--index",
            help="The model's HNSW index during the load: 'kept' (updated row by row; searches "
            "stay fast), 'deferred' (dropped before the load and built once after it: far "
            "faster for a large load, but searches of that model scan meanwhile) or 'auto' "
            "(deferred when the model is not the one serving, or has no vectors yet).",
        ),
    ] = "auto",
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            help="Worker processes that chunk, embed and write in parallel (one per CPU at "
            "most; a dry run uses one). Each loads its own copy of the model.",
        ),
    ] = 1,
    tenant: Annotated[
        str,
        typer.Option(
            "--tenant",
            help="The tenant (by name) the documents are for: its API keys see them. It must "
            "exist (`ragservice tenants create NAME`).",
        ),
    ] = DEFAULT_TENANT_NAME,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print the summary as one JSON document on stdout."),
    ] = False,
    readers: Annotated[
        str | None,
        typer.Option(
            "--readers",
            help="Who may read the documents, e.g. 'group:hr,user:ana' ('' : the whole "
            "tenant). A folder's .readers file and a JSONL row's readers field win over it; "
            "left out, stored documents keep theirs and new ones are the whole tenant's "
            "(docs/permissions.md).",
        ),
    ] = None,
    crawl: CrawlOption = False,
    depth: DepthOption = None,
    max_pages: MaxPagesOption = None,
    profile: ProfileOption = None,
    endpoint_url: EndpointUrlOption = None,
) -> None:
    """Load, chunk, embed and store documents, or import chunks with their vectors (JSONL
    lines with `chunks`, Parquet). Unchanged documents are not written again; files of a type
    no loader reads are skipped and listed. A web page (or a site, with --crawl) or an S3
    prefix is read as the collection's source for it."""
    from ingest.loaders import JsonlFields, ParquetColumns
    from ingest.pipeline import IngestReport
    from ragservice.services.index_upkeep import INDEX_MODES

    try:
        named_readers = parse_readers(readers)
    except InvalidInputError as exc:
        raise typer.BadParameter(str(exc), param_hint="--readers") from exc
    if index not in INDEX_MODES:
        raise typer.BadParameter("must be auto, kept or deferred", param_hint="--index")
    try:
        fields = JsonlFields.parse(jsonl_fields) if jsonl_fields else JsonlFields()
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--jsonl-fields") from exc
    try:
        columns = ParquetColumns.parse(parquet_columns) if parquet_columns else ParquetColumns()
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--parquet-columns") from exc
    if not collection.strip():
        raise typer.BadParameter("must not be empty", param_hint="--collection")
    asked = RemoteIngest(
        crawl, depth, max_pages, profile, endpoint_url, include, exclude, named_readers
    )
    if check_remote_ingest(paths, asked, dry_run=dry_run, prune=prune, workers=workers):
        raise typer.Exit(ingest_locations(paths, collection, tenant, asked, as_json=as_json))
    workers = _check_workers(workers, dry_run=dry_run)
    for path in paths:
        if not Path(path).exists():
            raise typer.BadParameter(f"{path} does not exist", param_hint="PATHS")
    outcome = _Outcome(IngestReport(dry_run=dry_run), tenant=tenant, collection=collection)
    ctrl_c, stopped = _CtrlC(), False
    previous = {sig: signal.signal(sig, ctrl_c) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            _run(
                [Path(path) for path in paths],
                collection,
                _Options(
                    include or [],
                    exclude or [],
                    fields,
                    columns,
                    model,
                    dry_run,
                    prune,
                    index,
                    workers,
                    tenant,
                    named_readers,
                ),
                outcome,
                ctrl_c,
            )
        except KeyboardInterrupt:
            stopped = True
        except RagServiceError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(ctrl_c.exit_status if ctrl_c.received else 1) from exc
        if as_json:
            typer.echo(json.dumps(outcome.to_json(interrupted=ctrl_c.received), indent=2))
        else:
            _print_summary(outcome.report)
        if ctrl_c.received:
            _print_interrupted(outcome.report, stopped=stopped, by=ctrl_c.name)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    # Read after the handler is back: a Ctrl-C until then is counted here, a later one is
    # Python's KeyboardInterrupt (a non-zero exit too).
    raise typer.Exit(ctrl_c.exit_status if ctrl_c.received else 0 if outcome.report.ok else 1)


@dataclass(frozen=True)
class _Options:
    include: list[str]
    exclude: list[str]
    fields: JsonlFields
    columns: ParquetColumns
    model: str | None
    dry_run: bool
    prune: bool
    index: str = "auto"
    workers: int = 1
    tenant: str = DEFAULT_TENANT_NAME
    readers: tuple[str, ...] | None = None


@dataclass
class _Outcome:
    """What the run did so far: kept up to date as it goes, so that a Ctrl-C still has it."""

    report: IngestReport
    tenant: str
    collection: str
    job_id: uuid.UUID | None = None

    def to_json(self, *, interrupted: bool) -> dict[str, Any]:
        """The `--json` summary."""
        report = self.report
        return {
            "tenant": self.tenant,
            "collection": self.collection,
            "job_id": None if self.job_id is None else str(self.job_id),
            "dry_run": report.dry_run,
            "ok": report.ok and not interrupted,
            "interrupted": interrupted,
            "counts": report.counts(),
            "seconds": round(report.seconds, 3),
            "write_seconds": round(report.write_seconds, 3),
            "pack_seconds": round(report.pack_seconds, 3),
            "failures": [{"source": f.source, "error": f.reason} for f in report.failed],
            "skipped": [{"source": f.source, "reason": f.reason} for f in report.skipped],
        }


def _check_workers(workers: int, *, dry_run: bool) -> int:
    """The number of worker processes to run: at least 1, at most one per CPU."""
    from ingest.parallel import max_workers

    if workers < 1:
        raise typer.BadParameter(f"must be at least 1 (got {workers})", param_hint="--workers")
    if workers > 1 and dry_run:
        console.print("a dry run writes nothing and runs in one process: --workers ignored")
        return 1
    cpus = max_workers()
    if workers > cpus:
        console.print(f"--workers {workers}: this machine has {cpus} CPUs, using {cpus} workers")
        return cpus
    return workers


def _run(
    paths: list[Path],
    collection: str,
    options: _Options,
    outcome: _Outcome,
    ctrl_c: _CtrlC,
) -> IngestReport:
    """Ingest into `outcome.report`, which keeps the counts of what committed if Ctrl-C stops
    the run."""
    from ingest.loaders import load_documents
    from ingest.targets import ingest_pipeline, resolve_model
    from ragservice.db import tenancy
    from ragservice.runtime import open_runtime

    # The model is loaded only once a document needs embedding: an import of vectors never does.
    with console.status("starting the database"):
        runtime = open_runtime(get_settings(), warm=False)
    try:
        tenant_id = _tenant_id(runtime, options.tenant)
        target = resolve_model(runtime, options.model)
        # The model active when the run starts (or the one named), throughout.
        pipeline = ingest_pipeline(runtime, tenant_id=tenant_id, model=target, load_other=True)
        items = load_documents(
            paths,
            include=options.include,
            exclude=options.exclude,
            jsonl_fields=options.fields,
            parquet_columns=options.columns,
            readers=options.readers,
        )
        params: dict[str, object] = {
            "paths": [str(p) for p in paths],
            "include": options.include,
            "exclude": options.exclude,
        }
        if options.model:
            params["model"] = options.model

        def load(on_progress: ProgressCallback, report: IngestReport) -> IngestReport:
            if options.workers > 1:
                from ingest.parallel import run_parallel

                return run_parallel(
                    runtime,
                    items,
                    workers=options.workers,
                    model_id=pipeline.model_id,
                    tenant_id=tenant_id,
                    collection=collection,
                    prune=options.prune,
                    on_progress=on_progress,
                    report=report,
                )
            return pipeline.run(
                items,
                collection=collection,
                dry_run=options.dry_run,
                prune=options.prune,
                on_progress=on_progress,
                report=report,
            )

        def run(on_progress: ProgressCallback, report: IngestReport) -> IngestReport:
            try:
                return with_index_upkeep(
                    runtime,
                    pipeline.model_id,
                    "kept" if options.dry_run else options.index,
                    lambda: load(on_progress, report),
                )
            finally:
                ctrl_c.stopping = False  # the job record and the clean-up run to the end

        with tenancy.as_tenant(tenant_id):  # the job record is the tenant's
            return _with_job_record(runtime, tenant_id, collection, params, outcome, run)
    finally:
        runtime.close()


def _tenant_id(runtime: Runtime, name: str) -> uuid.UUID:
    """The id of the tenant named `name`; NotFoundError for a name no tenant has."""
    return tenant_id_of(runtime.db, name)


def with_index_upkeep(
    runtime: Runtime, model_id: int, mode: str, load: Callable[[], IngestReport]
) -> IngestReport:
    """Run the load with the model's HNSW index kept as `mode` says (see `--index`), the
    drop and the build shown. After a load with `deferred` asked for (a large load),
    `ragservice db optimize` runs when the owner's login is at hand."""
    from ragservice.services import index_upkeep

    report, deferred = index_upkeep.with_index_upkeep(
        runtime.db, model_id, mode, load, view=_IndexView()
    )
    if deferred and mode == "deferred":
        _optimize_after_load(runtime)
    return report


class _IndexView:
    """The index's drop and build on the console, the build with a progress bar."""

    def dropped(self, label: str) -> None:
        console.print(f"HNSW index of {label}: dropped for the load, built after it")

    @contextmanager
    def building(self, label: str) -> Iterator[IndexProgress]:
        from rich.progress import BarColumn, MofNCompleteColumn

        from ragservice.cli.common import IndexBar

        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
        with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
            yield IndexBar(progress, label)

    def built(self, label: str, build: IndexBuild) -> None:
        console.print(
            f"built the {build.storage} HNSW index of {label} over {build.rows} rows in "
            f"{build.seconds:.1f} s"
        )


def _optimize_after_load(runtime: Runtime) -> None:
    """`ragservice db optimize` after a large load, as the owner; a note when this login is
    not the owner. (Not after `auto`: packing the postings makes every search wait.)"""
    from ragservice.cli.common import run_optimize_steps
    from ragservice.db import maintenance

    with runtime.db.owner_engine() as engine:
        try:
            with engine.connect() as conn:
                role = maintenance.check_owner(conn)
        except PermissionDeniedError:
            console.print(
                "db optimize skipped: this login does not own the tables (run `ragservice db "
                "optimize` as the database owner)"
            )
            return
        console.print(f"a large load: `ragservice db optimize` as {role}")
        run_optimize_steps(engine)


def _with_job_record(
    runtime: Runtime,
    tenant_id: uuid.UUID,
    collection: str,
    params: dict[str, object],
    outcome: _Outcome,
    run: Runner,
) -> IngestReport:
    """Run with a progress bar, recording the run in ingest_jobs (not for dry runs)."""

    from ragservice.services.ingest import recorded_run

    report = outcome.report
    if report.dry_run:
        _with_progress(run, report)
        return report
    worker = f"{socket.gethostname()}:{os.getpid()}"
    with recorded_run(runtime.db, tenant_id, collection, params, report, worker=worker) as job_id:
        outcome.job_id = job_id
        _with_progress(run, report)
    return report


def _with_progress(run: Runner, report: IngestReport) -> IngestReport:

    started = time.perf_counter()
    totals = {"docs": 0, "chunks": 0}
    columns = (
        SpinnerColumn(),
        TextColumn("[bold]{task.fields[docs]:,}[/bold] documents"),
        TextColumn("[bold]{task.fields[chunks]:,}[/bold] chunks"),
        TextColumn("{task.fields[rate]:,.1f} chunks/s"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("ingest", docs=0, chunks=0, rate=0.0)

        def on_progress(docs: int, chunks: int) -> None:
            totals["docs"] += docs
            totals["chunks"] += chunks
            rate = totals["chunks"] / max(time.perf_counter() - started, 1e-9)
            progress.update(task, docs=totals["docs"], chunks=totals["chunks"], rate=rate)

        return run(on_progress, report)


def _print_summary(report: IngestReport) -> None:

    table = Table(title="dry run (nothing written)" if report.dry_run else "ingest summary")
    table.add_column("documents")
    table.add_column("count", justify="right")
    for label, value in (
        ("new" if not report.dry_run else "new or changed", len(report.new)),
        ("updated", len(report.updated)),
        ("unchanged", len(report.unchanged)),
        ("deleted", len(report.deleted)),
        ("failed", len(report.failed)),
        ("skipped", len(report.skipped)),
    ):
        table.add_row(label, f"{value:,}")
    console.print(table)
    console.print(
        f"chunks written {report.chunks_written:,} (embedded {report.chunks_embedded:,}, "
        f"reused {report.chunks_reused:,}, imported with vectors {report.chunks_imported:,}) "
        f"in {report.seconds:.1f} s, {report.write_seconds:.1f} s of it in write transactions"
    )
    for failure in report.failed[:_MAX_FAILURES_SHOWN]:
        console.print(f"[red]failed[/red] {escape(failure.source)}: {escape(failure.reason)}")
    if len(report.failed) > _MAX_FAILURES_SHOWN:
        console.print(f"… and {len(report.failed) - _MAX_FAILURES_SHOWN} more failures")
    for skipped in report.skipped[:_MAX_FAILURES_SHOWN]:
        console.print(
            f"[yellow]skipped[/yellow] {escape(skipped.source)}: {escape(skipped.reason)}"
        )
    if len(report.skipped) > _MAX_FAILURES_SHOWN:
        console.print(f"… and {len(report.skipped) - _MAX_FAILURES_SHOWN} more skipped")


def _print_interrupted(report: IngestReport, *, stopped: bool, by: str = "Ctrl-C") -> None:

    if report.dry_run:
        console.print(f"[yellow]interrupted[/yellow] ({by}); nothing was written")
        return
    committed = (
        f"{len(report.new):,} new and {len(report.updated):,} updated documents "
        f"({report.chunks_written:,} chunks)"
    )
    if stopped:
        console.print(
            f"[yellow]interrupted[/yellow] by {by}; committed before it: {committed}, each "
            "document whole. Run the same command again to finish."
        )
    else:
        console.print(
            f"[yellow]{by}[/yellow] after the last batch had committed; nothing was cut "
            f"short (committed: {committed})"
        )


def main() -> None:
    """Entry point of `python -m ingest`."""
    from ragservice.cli.termination import end_cleanly_on_termination

    end_cleanly_on_termination()
    settings = get_settings()
    configure_logging(settings.observability.log_level, settings.observability.log_format)
    typer.run(ingest_command)
