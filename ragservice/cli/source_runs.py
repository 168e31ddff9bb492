"""What the source commands share (`ragservice sources`, `ragservice ingest URL`,
`ragservice sync`): a location told apart (web, S3, folder), the reader options the flags set,
a schedule read from `--every`, and one run of a source in this process, with a progress line
and its report printed, so that every command shows a run the same way."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from ragservice.cli.common import console
from ragservice.config import get_settings

if TYPE_CHECKING:
    from ingest.sources.sync import SyncReport
    from ragservice.db import Database
    from ragservice.runtime import Runtime
    from ragservice.services.sources import SourceView

REMOTE_SCHEMES = ("https://", "http://", "s3://")
_MAX_ERRORS_SHOWN = 20
EXIT_INTERRUPTED = 130  # the shell's status for a command stopped by SIGINT
_EVERY = re.compile(r"^(\d+)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def is_remote(location: str) -> bool:
    """Whether `location` is a web page or an S3 prefix rather than a local path."""
    return location.lower().startswith(REMOTE_SCHEMES)


def folder_location(location: str, param_hint: str) -> str:
    """A local folder as a source stores it: absolute, so that `sync PATH` run from another
    directory finds the same source; BadParameter for what is not a folder."""
    path = Path(location).expanduser()
    if not path.is_dir():
        raise typer.BadParameter(f"{location} is not a folder", param_hint=param_hint)
    return str(path.resolve())


def parse_every(value: str | None) -> int | None:
    """`--every 30m` → 1800 seconds (None: run only when asked); BadParameter otherwise."""
    if value is None:
        return None
    match = _EVERY.match(value.strip())
    if match is None or int(match.group(1)) == 0:
        raise typer.BadParameter(
            f"{value!r} is not an interval such as 30m, 1h or 1d", param_hint="--every"
        )
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def every_text(seconds: int | None) -> str:
    """A schedule for people: `every 1h`, `every 90s`, or `manual`."""
    if seconds is None:
        return "manual"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"every {seconds // size}{unit}"
    return f"every {seconds}s"


@dataclass(frozen=True)
class ReaderFlags:
    """The reader options a command's flags set; those left out are the reader's defaults."""

    depth: int | None = None
    max_pages: int | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    profile: str | None = None
    endpoint_url: str | None = None
    region: str | None = None

    def options(self) -> dict[str, Any]:
        """The `SourceSpec.options` of these flags (only what was given)."""
        given: dict[str, Any] = {
            "depth": self.depth,
            "max_pages": self.max_pages,
            "include": list(self.include) or None,
            "exclude": list(self.exclude) or None,
            "profile": self.profile,
            "endpoint_url": self.endpoint_url,
            "region": self.region,
        }
        return {name: value for name, value in given.items() if value is not None}


def tenant_id_of(db: Database, name: str) -> uuid.UUID:
    """The id of the tenant named `name`; NotFoundError (exit 1) for a name no tenant has."""
    from ragservice.services import tenants

    return tenants.tenant_id_of(db, name, hint=f" (`ragservice tenants create {name}` creates one)")


@contextmanager
def tenant_runtime(tenant: str) -> Iterator[tuple[Runtime, uuid.UUID]]:
    """The runtime (the model loads only once something embeds) for a command that runs a
    source here, and the tenant's id; within, transactions see that tenant's rows only."""
    from ragservice import runtime as runtimes
    from ragservice.db import tenancy

    with console.status("starting the database"):
        opened = runtimes.open_runtime(get_settings(), warm=False)
    try:
        tenant_id = tenant_id_of(opened.db, tenant)
        with tenancy.as_tenant(tenant_id):
            yield opened, tenant_id
    finally:
        opened.close()


def run_here(
    opened: Runtime,
    tenant_id: uuid.UUID,
    collection: str,
    source: SourceView,
    *,
    transient: bool = False,
) -> SyncReport:
    """Run `source` now in this process with a live line of what it found so far (gone when
    it ends if `transient`: `sync --watch` prints a line per run instead); the run is an ingest
    job like a worker's, and the service refuses it while another run is on."""
    from ragservice.services import sources

    started = time.perf_counter()
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("[bold]{task.fields[seen]:,}[/bold] documents"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=transient) as progress:
        task = progress.add_task(escape(source.location), seen=0)

        def on_progress(seen: SyncReport) -> None:
            progress.update(task, seen=seen.found)

        try:
            report = sources.run_now(opened, tenant_id, collection, source.id, progress=on_progress)
        except KeyboardInterrupt:
            progress.stop()
            console.print(
                f"[yellow]interrupted[/yellow]: the run of {escape(source.location)} stopped "
                "between documents and deleted nothing; what it wrote stays. Run it again to "
                "finish."
            )
            raise typer.Exit(EXIT_INTERRUPTED) from None
    if not transient:
        console.print(f"{escape(source.location)}: read in {time.perf_counter() - started:.1f} s")
    return report


def report_ok(report: SyncReport) -> bool:
    """Whether the run read the whole source and every document in it."""
    return report.complete and report.failure is None and report.failed == 0


def report_errors(report: SyncReport) -> list[dict[str, str]]:
    """The run's per-document errors as `{source, error}`, as ingest jobs list them."""
    return [{"source": key, "error": reason} for key, reason in report.errors]


def report_line(report: SyncReport) -> str:
    """One line for a run: `3 added, 1 changed, 2 removed, 7 unchanged, 0 failed` (and
    `, 2 skipped` when files were skipped)."""
    counts = report.counts()
    keys = ("added", "changed", "removed", "unchanged", "failed")
    text = ", ".join(f"{counts[key]} {key}" for key in keys)
    if report.skipped:
        text += f", {report.skipped} skipped"
    if report.failure is not None:
        return f"failed: {report.failure} ({text}; nothing removed)"
    return text if report.complete else f"{text} (incomplete: nothing removed)"


def print_report(report: SyncReport, title: str) -> None:
    """The run's counts as a table, then its per-document errors (the first 20)."""
    counts = report.counts()
    table = Table(title=escape(title))
    table.add_column("documents")
    table.add_column("count", justify="right")
    for key, value in counts.items():
        table.add_row(key.replace("_", " "), f"{value:,}")
    console.print(table)
    if report.failure is not None:
        console.print(f"[red]the source could not be read[/red]: {escape(report.failure)}")
    if not report.complete:
        console.print(
            "[yellow]the source was not read whole[/yellow]: nothing was removed this run"
        )
    for key, reason in report.errors[:_MAX_ERRORS_SHOWN]:
        console.print(f"[red]failed[/red] {escape(key)}: {escape(reason)}")
    if len(report.errors) > _MAX_ERRORS_SHOWN:
        console.print(f"… and {len(report.errors) - _MAX_ERRORS_SHOWN} more failures")
    for key, reason in report.skips[:_MAX_ERRORS_SHOWN]:
        console.print(f"[yellow]skipped[/yellow] {escape(key)}: {escape(reason)}")
    if report.skipped > _MAX_ERRORS_SHOWN:
        console.print(f"… and {report.skipped - _MAX_ERRORS_SHOWN} more skipped")


def report_json(
    report: SyncReport, tenant: str, collection: str, source: SourceView
) -> dict[str, Any]:
    """A run as `--json` prints it."""
    return {
        "tenant": tenant,
        "collection": collection,
        "source_id": str(source.id),
        "location": source.location,
        "ok": report_ok(report),
        "complete": report.complete,
        "failure": report.failure,
        "counts": report.counts(),
        "failures": report_errors(report),
        "skipped": [{"source": key, "reason": reason} for key, reason in report.skips],
    }


# -- `ragservice ingest URL` -----------------------------------------------------------------

CrawlOption = Annotated[
    bool, typer.Option("--crawl", help="Web: follow the page's links on the same site.")
]
DepthOption = Annotated[
    int | None,
    typer.Option("--depth", min=0, help="With --crawl: links followed from the page."),
]
MaxPagesOption = Annotated[
    int | None, typer.Option("--max-pages", min=1, help="With --crawl: pages read at most.")
]
ProfileOption = Annotated[str | None, typer.Option("--profile", help="S3: the AWS profile.")]
EndpointUrlOption = Annotated[
    str | None, typer.Option("--endpoint-url", help="S3: an S3-compatible endpoint.")
]


@dataclass(frozen=True)
class RemoteIngest:
    """What `ragservice ingest` was asked for a web page or an S3 prefix."""

    crawl: bool
    depth: int | None
    max_pages: int | None
    profile: str | None
    endpoint_url: str | None
    include: list[str] | None
    exclude: list[str] | None
    readers: tuple[str, ...] | None

    def options(self, location: str) -> dict[str, Any]:
        """The source's reader options: a URL without --crawl is that one page (depth 0)."""
        web = not location.lower().startswith("s3://")
        if web and (self.profile is not None or self.endpoint_url is not None):
            raise typer.BadParameter(
                "--profile and --endpoint-url are for s3:// locations", param_hint="--profile"
            )
        if not web and (self.crawl or self.depth is not None or self.max_pages is not None):
            raise typer.BadParameter(
                "--crawl, --depth and --max-pages are for web pages", param_hint="--crawl"
            )
        if web and not self.crawl and (self.depth is not None or self.max_pages is not None):
            raise typer.BadParameter(
                "--depth and --max-pages need --crawl (without it, only the page itself is read)",
                param_hint="--depth",
            )
        depth = self.depth if self.crawl else 0 if web else None
        include, exclude = tuple(self.include or ()), tuple(self.exclude or ())
        flags = ReaderFlags(
            depth, self.max_pages, include, exclude, self.profile, self.endpoint_url
        )
        return flags.options()


def check_remote_ingest(
    paths: list[str], asked: RemoteIngest, *, dry_run: bool, prune: bool, workers: int
) -> bool:
    """Whether `ingest` was given web or S3 locations (then only those, and none of the options
    of local files); BadParameter for a mix, or web/S3 options with local paths."""
    remote = [path for path in paths if is_remote(path)]
    if not remote:
        if asked.crawl or asked.depth is not None or asked.max_pages is not None:
            raise typer.BadParameter("is for web pages (https://…)", param_hint="--crawl/--depth")
        if asked.profile is not None or asked.endpoint_url is not None:
            raise typer.BadParameter(
                "is for s3:// locations", param_hint="--profile/--endpoint-url"
            )
        return False
    if len(remote) != len(paths):
        raise typer.BadParameter(
            "give local paths or web/S3 locations, not both in one command", param_hint="PATHS"
        )
    for flag, given in (("--dry-run", dry_run), ("--prune", prune), ("--workers", workers > 1)):
        if given:
            raise typer.BadParameter(
                f"{flag} is for local paths (a web or S3 location is a source: `ragservice "
                "sources add … --run` prunes what is gone)",
                param_hint=flag,
            )
    return True


def ingest_locations(
    locations: list[str], collection: str, tenant: str, asked: RemoteIngest, *, as_json: bool
) -> int:
    """Ingest each web page (or site, with --crawl) or S3 prefix: the collection's source for
    that location (added unscheduled, without pruning, when it has none) runs here. The exit
    status: 0 when every run read everything, else 1."""
    import json

    from ragservice.cli.common import cli_actor, exit_on_error
    from ragservice.services.callers import Operator
    from ragservice.services.sources import SourceSpec, find_or_add_source

    specs = [
        SourceSpec(
            location=location,
            options=asked.options(location),
            readers=asked.readers,
            prune=False,
        )
        for location in locations
    ]
    runs: list[dict[str, Any]] = []
    with exit_on_error(), tenant_runtime(tenant) as (opened, tenant_id):
        operator = Operator(tenant_id=tenant_id, actor=cli_actor())
        for spec in specs:
            source = find_or_add_source(
                opened.db, opened.settings, operator, collection, spec, operator=True
            )
            report = run_here(opened, tenant_id, collection, source)
            if not as_json:
                print_report(report, f"ingest {source.location}")
            runs.append(report_json(report, tenant, collection, source))
    ok = all(run["ok"] for run in runs)
    if as_json:
        summary = {"tenant": tenant, "collection": collection, "ok": ok, "runs": runs}
        typer.echo(json.dumps(summary, indent=2))
    return 0 if ok else 1
