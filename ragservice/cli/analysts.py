"""`ragservice analysts`: login roles with read-only SQL access to the analytics views."""

from __future__ import annotations

from typing import Annotated

import typer

from ragservice import store
from ragservice.cli.common import console, database, exit_on_error, fail
from ragservice.config import Settings, get_settings

app = typer.Typer(
    help="Read-only SQL access to the analytics views (docs/analysts.md).", no_args_is_help=True
)


@app.command("add")
def analysts_add(
    name: str = typer.Argument(..., help="The role's name: [a-z_][a-z0-9_]{0,62}."),
    password: Annotated[
        str | None, typer.Option("--password", help="Default: generated and printed once.")
    ] = None,
) -> None:
    """Create a login role that may read the views in schema `analytics` and nothing else, and
    print a connection string for it (to the first replica when RAGSERVICE_REPLICAS is set)."""
    import secrets

    secret = password or secrets.token_urlsafe(18)
    with database() as db:
        # CREATE ROLE: beyond what the service role may do
        with db.owner() as session, exit_on_error():
            store.analysts.create_analyst(session, name, secret)
        url = analyst_url(get_settings(), db.url, name, secret)
    console.print(f"created analyst {name!r} (member of {store.analysts.ANALYST_GROUP})")
    if password is None:
        console.print("its generated password is in the URL below; it is shown only this once:")
    typer.echo(url)


def analyst_url(settings: Settings, primary_url: str, name: str, password: str) -> str:
    """A libpq URL for the analyst: host, port, database and options of the first replica when
    any is configured, else of the primary (a Unix-socket URL with the embedded server)."""
    from urllib.parse import quote

    from sqlalchemy.engine import make_url

    replicas = settings.replica_urls()
    base = make_url(replicas[0][1] if replicas else primary_url)
    rest = base._replace(drivername="postgresql", username=None, password=None).render_as_string()
    scheme = "postgresql://"
    userinfo = f"{quote(name, safe='')}:{quote(password, safe='')}@"
    return scheme + userinfo + rest.removeprefix(scheme)


@app.command("list")
def analysts_list() -> None:
    """List the analyst roles (name, whether it can log in)."""
    with database() as db, db.read() as session:
        rows = store.analysts.list_analysts(session)
    for name, login in rows:
        typer.echo(f"{name}\t{'login' if login else 'nologin'}")


@app.command("remove")
def analysts_remove(name: str = typer.Argument(..., help="The analyst's role name.")) -> None:
    """Drop an analyst's role (only members of ragservice_analyst are dropped)."""
    with database() as db, db.owner() as session, exit_on_error():
        removed = store.analysts.remove_analyst(session, name)
    if not removed:
        raise fail(f"no analyst named {name!r}")
    console.print(f"removed analyst {name!r}")
