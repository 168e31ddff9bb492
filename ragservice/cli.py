"""The `ragservice` command: serve, ingest, db upgrade."""

from __future__ import annotations

import typer
from rich.console import Console

from ragservice.config import configure_logging, get_settings
from ragservice.errors import RagServiceError

app = typer.Typer(
    help="RAG and vector-search data service on PostgreSQL + pgvector.", no_args_is_help=True
)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")
console = Console(stderr=True)


@app.command()
def serve(
    host: str | None = typer.Option(None, help="Bind address (default RAGSERVICE_HOST)."),
    port: int | None = typer.Option(None, help="Port (default RAGSERVICE_PORT)."),
) -> None:
    """Serve the REST API (embedded PostgreSQL unless RAGSERVICE_DATABASE_URL is set)."""
    import uvicorn

    settings = get_settings()
    uvicorn.run(
        "ragservice.api.app:create_app",
        factory=True,
        host=host or settings.host,
        port=port or settings.port,
        log_level=settings.log_level.lower(),
    )


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head")) -> None:
    """Apply the schema migrations (the server and the CLI also do this on start)."""
    from ragservice.db import open_database
    from ragservice.db.migrate import current_revision

    try:
        db = open_database(get_settings())
    except RagServiceError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    try:
        if revision != "head":
            from ragservice.db import migrate

            migrate.upgrade(db.write_engine, revision)
        with db.write_engine.connect() as conn:
            console.print(f"schema at revision {current_revision(conn)}")
    finally:
        db.dispose()


def _register_ingest() -> None:
    from ingest.cli import ingest_command

    app.command("ingest")(ingest_command)


_register_ingest()


def main() -> None:
    configure_logging(get_settings().log_level)
    app()
