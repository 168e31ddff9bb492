"""`ragservice db`: the database schema, and the retention purge."""

from __future__ import annotations

from typing import Annotated

import typer

from ragservice.cli.common import console, database
from ragservice.config import get_settings

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
    typer.echo(f"query_log\t{report.queries}")
    typer.echo(f"feedback\t{report.feedback}")
    typer.echo(f"ingest_job_items\t{report.job_items}")
