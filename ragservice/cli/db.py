"""`ragservice db`: the database schema."""

from __future__ import annotations

import typer

from ragservice.cli.common import console, database

app = typer.Typer(help="Database schema.", no_args_is_help=True)


@app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head")) -> None:
    """Apply the schema migrations (the server and the CLI also do this on start)."""
    from ragservice.db import migrate

    with database() as db, db.owner_engine() as engine:
        if revision != "head":
            migrate.upgrade(engine, revision)
        with engine.connect() as conn:
            console.print(f"schema at revision {migrate.current_revision(conn)}")
