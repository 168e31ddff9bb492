"""`ragservice sources`: the web sites, S3 prefixes and folders a collection follows; add one
(an operator may add a folder of this machine), list them with their last run, run one now
here or hand the run to the workers, remove one (and, if asked, its documents)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ragservice.cli.common import cli_actor, console, database, exit_on_error
from ragservice.cli.source_runs import (
    ReaderFlags,
    every_text,
    folder_location,
    is_remote,
    parse_every,
    print_report,
    report_json,
    report_ok,
    run_here,
    tenant_id_of,
    tenant_runtime,
)
from ragservice.config import DEFAULT_TENANT_NAME, get_settings
from ragservice.errors import InvalidInputError
from ragservice.readers import parse_readers

if TYPE_CHECKING:
    from ingest.sources.credentials import Credentials
    from ragservice.db import Database
    from ragservice.services.callers import Operator
    from ragservice.services.sources import SourceRun, SourceSpec, SourceView

app = typer.Typer(
    help="Sources a collection follows: web sites, S3 prefixes, folders.", no_args_is_help=True
)

CollectionOption = Annotated[str, typer.Option("--collection", "-c", help="The collection.")]
TenantOption = Annotated[
    str, typer.Option("--tenant", help="The tenant (by name) the collection is of.")
]
SourceIdArgument = Annotated[uuid.UUID, typer.Argument(help="The source's id.", show_default=False)]
PASSWORD_VARIABLE = "RAGSERVICE_SOURCE_PASSWORD"


@app.command("add")
def sources_add(
    location: Annotated[
        str,
        typer.Argument(help="https://… (a site), s3://bucket/prefix, or a folder of this machine."),
    ],
    collection: CollectionOption,
    every: Annotated[
        str | None,
        typer.Option("--every", help="Run it on a schedule: 30m, 1h, 1d (default: when asked)."),
    ] = None,
    depth: Annotated[
        int | None, typer.Option("--depth", min=0, help="Web: links followed from the start.")
    ] = None,
    max_pages: Annotated[
        int | None, typer.Option("--max-pages", min=1, help="Web: pages read at most per run.")
    ] = None,
    include: Annotated[
        list[str] | None, typer.Option("--include", help="Glob of keys to take (repeatable).")
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option("--exclude", help="Glob of keys to skip (repeatable).")
    ] = None,
    profile: Annotated[str | None, typer.Option("--profile", help="S3: the AWS profile.")] = None,
    endpoint_url: Annotated[
        str | None, typer.Option("--endpoint-url", help="S3: an S3-compatible endpoint.")
    ] = None,
    region: Annotated[str | None, typer.Option("--region", help="S3: the bucket's region.")] = None,
    username: Annotated[
        str | None,
        typer.Option(
            "--username",
            help="Read it as this user (S3: access key id); the password (secret key) comes "
            f"from {PASSWORD_VARIABLE}, else is asked for. Never shown again.",
        ),
    ] = None,
    readers: Annotated[
        str | None,
        typer.Option("--readers", help="Who may read its documents, e.g. 'group:hr,user:ana'."),
    ] = None,
    no_prune: Annotated[
        bool,
        typer.Option("--no-prune", help="Keep documents that are gone from the source."),
    ] = False,
    run: Annotated[bool, typer.Option("--run", help="Run it once now, here.")] = False,
    tenant: TenantOption = DEFAULT_TENANT_NAME,
    as_json: Annotated[bool, typer.Option("--json", help="Print the source as JSON.")] = False,
) -> None:
    """Add a source to a collection; with --run, run it at once (else its schedule, `sources
    run` or the console's Run now does)."""
    from ragservice.services import sources

    flags = ReaderFlags(
        depth, max_pages, tuple(include or ()), tuple(exclude or ()), profile, endpoint_url, region
    )
    spec = sources.SourceSpec(
        location=location if is_remote(location) else folder_location(location, "LOCATION"),
        options=flags.options(),
        readers=_readers(readers),
        every_seconds=parse_every(every),
        prune=not no_prune,
        credentials=_credentials(username),
    )
    with exit_on_error():
        if run:
            _add_and_run(tenant, collection, spec, as_json=as_json)
            return
        with _tenant_db(tenant) as (db, operator):
            source = sources.add_source(
                db, get_settings(), operator, collection, spec, operator=True
            )
    _show_added(source, as_json=as_json)


@app.command("list")
def sources_list(
    collection: CollectionOption,
    tenant: TenantOption = DEFAULT_TENANT_NAME,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead.")] = False,
) -> None:
    """The collection's sources, one a line: id, location, schedule, next run, last run's
    status, its counts (added/changed/removed/failed) and its number of errors."""
    from ragservice.services import sources

    with exit_on_error(), _tenant_db(tenant) as (db, operator):
        listed = sources.list_sources(db, operator.tenant_id, collection)
    if as_json:
        typer.echo(json.dumps([source_json(source) for source in listed], indent=2))
        return
    if not listed:
        console.print(f"no sources in collection {collection!r}")
    for source in listed:
        typer.echo("\t".join(_line(source)))


@app.command("run")
def sources_run(
    source_id: SourceIdArgument,
    collection: CollectionOption,
    queue: Annotated[
        bool,
        typer.Option("--queue", help="Hand the run to the workers and print its job's id."),
    ] = False,
    tenant: TenantOption = DEFAULT_TENANT_NAME,
) -> None:
    """Run a source now, here, with a progress line and its counts (exit 1 when a document
    failed or the source could not be read whole); with --queue, a worker runs it."""
    from ragservice.services import sources

    with exit_on_error():
        if queue:
            with _tenant_db(tenant) as (db, operator):
                job_id = sources.queue_run(db, operator.tenant_id, collection, source_id)
            typer.echo(str(job_id))
            console.print(f"run of source {source_id} queued as job {job_id}")
            return
        with tenant_runtime(tenant) as (opened, tid):
            source = sources.get_source(opened.db, tid, collection, source_id)
            report = run_here(opened, tid, collection, source)
    print_report(report, f"source {source.location}")
    raise typer.Exit(0 if report_ok(report) else 1)


@app.command("remove")
def sources_remove(
    source_id: SourceIdArgument,
    collection: CollectionOption,
    delete_documents: Annotated[
        bool,
        typer.Option("--delete-documents", help="Delete the documents it brought in too."),
    ] = False,
    tenant: TenantOption = DEFAULT_TENANT_NAME,
) -> None:
    """Remove a source (its documents stay unless --delete-documents)."""
    from ragservice.services import sources

    with exit_on_error(), _tenant_db(tenant) as (db, operator):
        sources.remove_source(
            db, operator, collection, source_id, delete_documents=delete_documents
        )
    kept = "and its documents " if delete_documents else ""
    console.print(f"removed source {source_id} {kept}from collection {collection!r}")


# -- helpers ---------------------------------------------------------------------------------


def _credentials(username: str | None) -> Credentials | None:
    """`--username` with its password, from PASSWORD_VARIABLE or asked for without echo."""
    from ingest.sources.credentials import Credentials

    if username is None:
        return None
    password = os.environ.get(PASSWORD_VARIABLE)
    if password is None:
        password = typer.prompt(
            "Password (empty: none)", default="", hide_input=True, show_default=False
        )
    return Credentials(username, password)


def _readers(value: str | None) -> tuple[str, ...] | None:
    try:
        return parse_readers(value)
    except InvalidInputError as exc:
        raise typer.BadParameter(str(exc), param_hint="--readers") from exc


@contextmanager
def _tenant_db(tenant: str) -> Iterator[tuple[Database, Operator]]:
    """The database, and the operator acting for the tenant named `tenant` (whose rows alone
    the transactions within see)."""
    from ragservice.db import tenancy
    from ragservice.services.callers import Operator

    with database() as db:
        operator = Operator(tenant_id=tenant_id_of(db, tenant), actor=cli_actor())
        with tenancy.as_tenant(operator.tenant_id):
            yield db, operator


def _add_and_run(tenant: str, collection: str, spec: SourceSpec, *, as_json: bool) -> None:
    from ragservice.services import sources
    from ragservice.services.callers import Operator

    with tenant_runtime(tenant) as (opened, tid):
        operator = Operator(tenant_id=tid, actor=cli_actor())
        source = sources.add_source(
            opened.db, opened.settings, operator, collection, spec, operator=True
        )
        console.print(f"added source {source.id} ({source.kind}) to collection {collection!r}")
        report = run_here(opened, tid, collection, source)
    if as_json:
        typer.echo(json.dumps(report_json(report, tenant, collection, source), indent=2))
    else:
        print_report(report, f"source {source.location}")
    raise typer.Exit(0 if report_ok(report) else 1)


def _show_added(source: SourceView, *, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(source_json(source), indent=2))
        return
    typer.echo(str(source.id))
    console.print(
        f"added source {source.id} ({source.kind}, {every_text(source.every_seconds)}) to "
        f"collection {source.collection!r}"
    )


def _line(source: SourceView) -> list[str]:
    run = source.last_run
    counts = {} if run is None else run.counts
    return [
        str(source.id),
        source.location,
        every_text(source.every_seconds),
        _when(source.next_run_at),
        run.status if run else "never run",
        "/".join(str(counts.get(key, 0)) for key in ("added", "changed", "removed", "failed")),
        f"{len(run.errors) if run else 0} errors",
    ]


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.isoformat(timespec="seconds")


def source_json(source: SourceView) -> dict[str, Any]:
    """A source as `sources list --json` prints it."""
    run = source.last_run
    return {
        "id": str(source.id),
        "collection": source.collection,
        "kind": source.kind,
        "location": source.location,
        "options": source.options,
        "readers": None if source.readers is None else list(source.readers),
        "every_seconds": source.every_seconds,
        "prune": source.prune,
        "has_credentials": source.has_credentials,
        "next_run_at": None if source.next_run_at is None else source.next_run_at.isoformat(),
        "created_at": source.created_at.isoformat(),
        "last_run": None if run is None else _run_json(run),
    }


def _run_json(run: SourceRun) -> dict[str, Any]:
    return {
        "job_id": str(run.job_id),
        "status": run.status,
        "counts": dict(run.counts),
        "errors": list(run.errors),
        "started_at": None if run.started_at is None else run.started_at.isoformat(),
        "finished_at": None if run.finished_at is None else run.finished_at.isoformat(),
    }
