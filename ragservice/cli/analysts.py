"""`ragservice analysts`: login roles with read-only SQL access to the analytics views, each
bound to one tenant (or explicitly to all), with a statement timeout."""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Annotated

import typer

from ragservice.cli.common import (
    cli_actor,
    console,
    database,
    exit_on_error,
    fail,
    tenant_named,
)
from ragservice.config import ReplicationSettings, get_settings

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

app = typer.Typer(
    help="Read-only SQL access to the analytics views (docs/analysts.md).", no_args_is_help=True
)

TenantOption = Annotated[
    str | None,
    typer.Option("--tenant", help="The tenant (by name) whose rows the analyst may read."),
]
AllTenantsOption = Annotated[
    bool,
    typer.Option("--all-tenants", help="The analyst may read every tenant's rows."),
]


@app.command("add")
def analysts_add(
    name: str = typer.Argument(
        ..., help="The role's name: up to 63 lowercase letters, digits and _, not a digit first."
    ),
    tenant: TenantOption = None,
    all_tenants: AllTenantsOption = False,
    password_stdin: Annotated[
        bool,
        typer.Option(
            "--password-stdin",
            help="Read the password from standard input (default: generated, printed once).",
        ),
    ] = False,
) -> None:
    """Create a login role that may read the views in schema `analytics` (the rows of one
    tenant, or of every tenant with --all-tenants) and nothing else, with the statement timeout
    RAGSERVICE_ANALYST_STATEMENT_TIMEOUT_SECONDS, and print a connection string for it (to the
    first replica when RAGSERVICE_REPLICAS is set)."""
    import secrets

    from ragservice.services import analysts

    _one_scope(tenant, all_tenants)
    password = _read_password() if password_stdin else secrets.token_urlsafe(18)
    settings = get_settings()
    with database() as db:
        # CREATE ROLE: beyond what the service role may do
        with db.owner() as session, exit_on_error():
            bound = _tenant_id(session, tenant)
            analysts.add_analyst(
                session,
                name,
                password,
                tenant_id=bound,
                timeout_seconds=settings.database.analyst_statement_timeout_seconds,
                actor=cli_actor(),
            )
            _warn_if_temporary(session)
        url = analyst_url(settings.replication, db.url, name, None if password_stdin else password)
    scope = "every tenant" if tenant is None else f"tenant {tenant!r}"
    console.print(
        f"created analyst {name!r} (member of {analysts.ANALYST_GROUP}), reading {scope}, "
        f"statement timeout {settings.database.analyst_statement_timeout_seconds}s"
    )
    if not password_stdin:
        console.print("its generated password is in the URL below; it is shown only this once:")
    typer.echo(url)


@app.command("update")
def analysts_update(
    name: str = typer.Argument(..., help="The analyst's role name."),
    tenant: TenantOption = None,
    all_tenants: AllTenantsOption = False,
) -> None:
    """Bind an analyst to one tenant (or to every tenant) in this database, and set its timeouts
    to RAGSERVICE_ANALYST_STATEMENT_TIMEOUT_SECONDS again; the password stays."""
    from ragservice.services import analysts

    _one_scope(tenant, all_tenants)
    seconds = get_settings().database.analyst_statement_timeout_seconds
    with database() as db, db.owner() as session, exit_on_error():
        bound = _tenant_id(session, tenant)
        analysts.update_analyst(
            session, name, tenant_id=bound, timeout_seconds=seconds, actor=cli_actor()
        )
        _warn_if_temporary(session)
    scope = "every tenant" if tenant is None else f"tenant {tenant!r}"
    console.print(f"analyst {name!r} now reads {scope}, statement timeout {seconds}s")


def analyst_url(
    replication: ReplicationSettings, primary_url: str, name: str, password: str | None
) -> str:
    """A libpq URL for the analyst: host, port, database and options of the first replica when
    any is configured, else of the primary (a Unix-socket URL with the embedded server). Without
    `password` (the operator chose it) the URL has none."""
    from urllib.parse import quote

    from sqlalchemy.engine import make_url

    replicas = replication.replica_urls()
    base = make_url(replicas[0][1] if replicas else primary_url)
    rest = base._replace(drivername="postgresql", username=None, password=None).render_as_string()
    scheme = "postgresql://"
    userinfo = quote(name, safe="")
    if password is not None:
        userinfo += ":" + quote(password, safe="")
    return scheme + userinfo + "@" + rest.removeprefix(scheme)


@app.command("list")
def analysts_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False,
) -> None:
    """List the analysts, tab-separated: name, login or nologin, the tenant it reads ("all":
    every tenant, "none": no binding in this database, so no rows), statement timeout."""
    from ragservice.services import analysts

    with database() as db, db.owner() as session:
        rows = analysts.list_analysts(session)
        _warn_if_temporary(session)
    listed = [
        {
            "name": analyst.name,
            "login": analyst.can_login,
            "tenant": analyst.tenant or ("all" if analyst.bound else "none"),
            "statement_timeout": analyst.timeouts.get("statement_timeout"),
        }
        for analyst in rows
    ]
    if as_json:
        typer.echo(json.dumps(listed, indent=2))
        return
    for row in listed:
        login = "login" if row["login"] else "nologin"
        typer.echo(f"{row['name']}\t{login}\t{row['tenant']}\t{row['statement_timeout'] or 'none'}")


@app.command("remove")
def analysts_remove(name: str = typer.Argument(..., help="The analyst's role name.")) -> None:
    """Drop an analyst's role and its tenant binding (only members of ragservice_analyst are
    dropped)."""
    from ragservice.services import analysts

    with database() as db, db.owner() as session, exit_on_error():
        removed = analysts.remove_analyst(session, name, actor=cli_actor())
    if not removed:
        raise fail(f"no analyst named {name!r}")
    console.print(f"removed analyst {name!r}")


def _one_scope(tenant: str | None, all_tenants: bool) -> None:
    """Exactly one of --tenant and --all-tenants: nobody reads every tenant by default."""
    if (tenant is not None) == all_tenants:
        raise typer.BadParameter(
            "give exactly one of --tenant NAME (one tenant's rows) or --all-tenants",
            param_hint="--tenant / --all-tenants",
        )


def _tenant_id(session: Session, tenant: str | None) -> uuid.UUID | None:
    """The id of tenant `tenant` (None: every tenant); exit 1 for a tenant that does not exist."""
    if tenant is None:
        return None
    return tenant_named(session, tenant, " (`ragservice keys create --tenant` creates one)")


def _warn_if_temporary(session: Session) -> None:
    """Say so when analysts may still create temporary tables here (the connecting user does
    not own the database, or the database's ACL was reset since)."""
    from ragservice.services import analysts

    if analysts.temporary_tables_open(session):
        console.print(
            "[yellow]warning:[/yellow] PUBLIC may create temporary tables in this database, so "
            "analysts may too; `ragservice analysts update NAME ...` as the database's owner "
            "revokes it (docs/analysts.md)"
        )


def _read_password() -> str:
    """The password on standard input, without its final line break; exit 1 when empty."""
    import sys

    password = sys.stdin.read().removesuffix("\n").removesuffix("\r")
    if not password:
        raise fail("--password-stdin: standard input held no password")
    return password
