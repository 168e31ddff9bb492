"""`ragservice db`: the database schema, and the retention purge."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer

from ragservice.cli.common import console, database
from ragservice.config import get_settings

if TYPE_CHECKING:
    from ragservice.safety.injection import Verdict
    from ragservice.store.documents import ScannedChunk

app = typer.Typer(help="Database schema and retention.", no_args_is_help=True)


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
    from ragservice.bootstrap import purge_retention

    with database() as db:
        report = purge_retention(
            db,
            get_settings(),
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
    from ragservice import store
    from ragservice.safety import injection

    flagged = cleared = seen = 0
    with database() as db:
        with db.read() as session:
            total = store.documents.count_chunks(session)
        with _progress("scanning chunks", total) as advance:
            after = None
            while True:
                with db.write() as session:
                    page = store.documents.chunks_page(session, after=after, limit=batch)
                    changes = _flag_changes(page, injection.scan)
                    store.documents.set_injection_flags(session, changes)
                if not page:
                    break
                after = page[-1].id
                seen += len(page)
                flagged += sum(reasons is not None for reasons in changes.values())
                cleared += sum(reasons is None for reasons in changes.values())
                advance(len(page))
    console.print(f"scanned {seen} chunks: {flagged} newly flagged, {cleared} no longer flagged")


def _flag_changes(
    page: list[ScannedChunk], scan: Callable[[str], Verdict]
) -> dict[uuid.UUID, list[str] | None]:
    """chunk id → its new reasons (None: unflag), for the chunks whose flag changes."""
    changes: dict[uuid.UUID, list[str] | None] = {}
    for chunk in page:
        verdict = scan(chunk.text)
        reasons = list(verdict.reasons) if verdict.flagged else None
        if reasons != chunk.flags:
            changes[chunk.id] = reasons
    return changes


@contextmanager
def _progress(label: str, total: int) -> Iterator[Callable[[int], None]]:
    from rich.progress import Progress

    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(label, total=total)
        yield lambda n: progress.advance(task, n)
