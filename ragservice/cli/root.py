"""The root `ragservice` command: its commands and command groups, in the order `--help`
lists them, and `main()`, the console script."""

from __future__ import annotations

from typing import Annotated

import typer

from ragservice.cli import (
    analysts,
    audit,
    backup,
    db,
    embedding_models,
    feedback,
    groups,
    jobs,
    keys,
    mcp_server,
    query,
    replicas,
    rerankers,
    serve,
    sources,
    tenants,
    training,
)
from ragservice.cli.ingest import ingest_command
from ragservice.cli.sync import sync_command
from ragservice.cli.termination import end_cleanly_on_termination
from ragservice.config import get_settings
from ragservice.observability.logs import configure_logging

app = typer.Typer(
    help="RAG and vector-search data service on PostgreSQL + pgvector.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"ragservice {package_version()}")
        raise typer.Exit()


@app.callback()
def root(
    _version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the installed version and exit.",
        ),
    ] = False,
) -> None:
    """RAG and vector-search data service on PostgreSQL + pgvector."""


def package_version() -> str:
    """The installed package's version, from its metadata."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ragservice")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


app.command("serve")(serve.serve)
app.command("dev-cluster")(replicas.dev_cluster)
app.command("worker")(serve.worker)
app.command("export-feedback")(feedback.export_feedback)
app.command("finetune")(training.finetune)
app.command("reembed")(training.reembed)
app.command("ingest")(ingest_command)
app.command("sync")(sync_command)
app.add_typer(sources.app, name="sources")
app.command("search")(query.search)
app.command("ask")(query.ask)
app.command("mcp")(mcp_server.mcp)
app.add_typer(jobs.app, name="jobs")
app.command("backup")(backup.backup)
app.command("restore")(backup.restore)
app.add_typer(db.app, name="db")
app.add_typer(keys.app, name="keys")
app.add_typer(groups.app, name="groups")
app.add_typer(tenants.app, name="tenants")
app.add_typer(replicas.app, name="replicas")
app.add_typer(embedding_models.app, name="models")
app.add_typer(rerankers.app, name="rerankers")
app.add_typer(analysts.app, name="analysts")
app.add_typer(audit.app, name="audit")


def main(prog_name: str | None = None) -> None:
    """The console script (and `python -m ragservice`, which names the program)."""
    end_cleanly_on_termination()
    settings = get_settings()
    configure_logging(settings.observability.log_level, settings.observability.log_format)
    app(prog_name=prog_name)
