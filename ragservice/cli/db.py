"""`ragservice db`: the database schema, the retention purge, the server's settings and the
optimize after large loads."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ragservice.cli.common import console, database, exit_on_error, fail, run_optimize_steps
from ragservice.config import DatabaseSettings, get_settings

if TYPE_CHECKING:
    import psycopg


app = typer.Typer(
    help="Database schema, retention, the server's settings and optimize.", no_args_is_help=True
)


@app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head")) -> None:
    """Apply the schema migrations (the server and the CLI also do this on start)."""
    from ragservice.db import migrate

    with database() as db, db.owner_engine() as engine:
        if revision != "head":
            migrate.upgrade(engine, revision)
        with engine.connect() as conn:
            console.print(f"schema at revision {migrate.current_revision(conn)}")


@app.command("purge")
def db_purge(
    query_log_days: Annotated[
        int | None,
        typer.Option(
            "--query-log-days",
            min=0,
            help="Override RAGSERVICE_QUERY_LOG_RETENTION_DAYS (0: keep the query log).",
        ),
    ] = None,
    job_payload_hours: Annotated[
        float | None,
        typer.Option(
            "--job-payload-hours",
            min=0,
            help="Override RAGSERVICE_JOB_PAYLOAD_RETENTION_HOURS.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object.")] = False,
) -> None:
    """Run the retention purge once (servers run it every RAGSERVICE_RETENTION_PURGE_SECONDS):
    logged queries past the retention with their feedback, and the uploads of ended jobs."""
    from ragservice.retention import purge_retention

    with database() as db:
        report = purge_retention(
            db,
            get_settings().retention,
            query_log_days=query_log_days,
            job_payload_hours=job_payload_hours,
        )
    purged = {
        "query_log": report.queries,
        "feedback": report.feedback,
        "ingest_job_items": report.job_items,
    }
    if as_json:
        typer.echo(json.dumps(purged))
        return
    for table, rows in purged.items():
        typer.echo(f"{table}\t{rows}")


@app.command("rescan")
def db_rescan(
    batch: Annotated[int, typer.Option(min=1, max=100_000, help="Chunks per transaction.")] = 2000,
) -> None:
    """Run the injection detector again over every stored chunk and update its flag (chunks
    stored before migration 0011, or after a detector change). Prints how many changed."""
    from ragservice.services import rescan

    with database() as db, _progress("scanning chunks", rescan.count_chunks(db)) as advance:
        done = rescan.rescan_injection_flags(db, batch=batch, on_page=advance)
    console.print(
        f"scanned {done.seen} chunks: {done.flagged} newly flagged, "
        f"{done.cleared} no longer flagged"
    )


@contextmanager
def _progress(label: str, total: int) -> Iterator[Callable[[int], None]]:
    from rich.progress import Progress

    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(label, total=total)
        yield lambda n: progress.advance(task, n)


@app.command("settings")
def db_settings(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """The server's running settings beside the values recommended for this machine, and where
    each running value came from (sized, override, server default, ...). The embedded server
    runs the recommended ones (sized before every start, RAGSERVICE_EMBEDDED_PG_SETTINGS over
    them); an external server (RAGSERVICE_DATABASE_URL) is only read, never changed."""
    from ragservice.db import server_settings, sizing
    from ragservice.db.embedded import pgdata_dir, postgres_bin_dir

    database = get_settings().database
    embedded = database.url is None
    with exit_on_error():
        overrides = sizing.parse_overrides(database.embedded_pg_settings)
        with _owner_connection(database) as conn:
            if embedded:
                pgdata: Path | None = pgdata_dir(database.data_dir)
                machine = sizing.probe_machine(pgdata, postgres_bin_dir())
            else:
                pgdata, machine = None, sizing.probe_machine()
                compressions = server_settings.server_wal_compressions(conn)
                machine = dataclasses.replace(machine, wal_compression=compressions)
            planned = {p.name: p for p in sizing.plan(machine, overrides)}
            running = server_settings.running_settings(conn, planned, pgdata)
    rows = [
        {
            "name": r.name,
            "running": r.value,
            "source": r.source,
            "pending_restart": r.pending_restart,
            "recommended": planned[r.name].value,
            "recommended_from": planned[r.name].origin,
        }
        for r in running
    ]
    if as_json:
        document = {"embedded": embedded, "machine": machine.describe(), "settings": rows}
        typer.echo(json.dumps(document, indent=2))
        return
    _print_settings(rows)
    console.print(f"recommended for this machine: {machine.describe()}")
    if not embedded:
        console.print(
            "an external server: nothing was changed. Its machine may differ from this one; "
            "set these in its postgresql.conf (or ALTER SYSTEM) as fits that machine"
        )


def _print_settings(rows: list[dict[str, Any]]) -> None:
    typer.echo(f"{'setting':<34}{'running':<26}{'recommended':<22}running value from")
    for row in rows:
        running = row["running"] + (" (restart pending)" if row["pending_restart"] else "")
        recommended = row["recommended"]
        if row["recommended_from"] == "override":
            recommended += " (override)"
        typer.echo(f"{row['name']:<34}{running:<26}{recommended:<22}{row['source']}")


@contextmanager
def _owner_connection(database: DatabaseSettings) -> Iterator[psycopg.Connection[Any]]:
    """A plain connection as the owner's login (the embedded server's administrator), for
    reading the server's settings; the embedded server is started (or joined) for it."""
    import psycopg
    from sqlalchemy.engine import make_url

    from ragservice.db.engine import resolve_database_url, resolve_owner_url

    url = resolve_owner_url(database, resolve_database_url(database))
    libpq = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        conn = psycopg.connect(libpq, autocommit=True)
    except psycopg.OperationalError as exc:
        raise fail(f"cannot connect to PostgreSQL: {exc}") from exc
    with conn:
        yield conn


@app.command("optimize")
def db_optimize() -> None:
    """Pack the BM25 postings (rewritten in key order) and vacuum and analyze the other big
    tables, as the database owner, with a line per step (bytes before and after). Searches
    wait while the postings are packed: run it after a large load (`ingest --index deferred`
    runs it by itself) or out of hours."""
    with database() as db, exit_on_error(), db.owner_engine() as engine:
        run_optimize_steps(engine)


@app.command("distribute")
def db_distribute(
    check: Annotated[
        bool, typer.Option("--check", help="Only list what stands in the way; change nothing.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object.")] = False,
) -> None:
    """Spread the store over a Citus cluster (the owner's login on its coordinator): the small
    global tables become reference tables, the tenants' tables are distributed by tenant and
    co-located (docs/scaling.md#distributing-on-citus). The schema is checked first: while
    anything in it stands in the way, nothing is changed and the blockers are listed (exit 1).
    Tables already converted are skipped, so running it again finishes an interrupted run."""
    from ragservice.db import distribution

    with database():
        pass  # brings the schema up to date before it is checked
    with exit_on_error(), _owner_connection(get_settings().database) as conn:
        version = distribution.require_coordinator(conn)
        blockers = distribution.check(conn)
        if check or blockers:
            _report_blockers(version, blockers, as_json=as_json)
            if blockers:
                raise typer.Exit(1)
            return

        def step_done(step: distribution.Step, number: int, total: int) -> None:
            state = "already" if step.done_before else "now"
            if not as_json:
                console.print(f"[{number}/{total}] {step.table}: {state} {step.placement}")

        report = distribution.distribute(conn, progress=step_done)
    if as_json:
        steps = [dataclasses.asdict(step) for step in report.steps]
        typer.echo(json.dumps({"citus": version, "blockers": [], "steps": steps}))
        return
    console.print(f"distributed: {len(report.converted)} tables converted now")


def _report_blockers(version: str, blockers: list[Any], *, as_json: bool) -> None:
    if as_json:
        rows = [dataclasses.asdict(blocker) for blocker in blockers]
        typer.echo(json.dumps({"citus": version, "blockers": rows, "steps": []}))
        return
    if not blockers:
        console.print(f"citus {version}: the schema can be distributed")
        return
    console.print(
        f"citus {version}: {len(blockers)} things in the schema stand in the way; "
        "nothing was changed"
    )
    for blocker in blockers:
        typer.echo(f"  {blocker.describe()}")
