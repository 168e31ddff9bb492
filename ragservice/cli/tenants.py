"""`ragservice tenants`: list and create tenants, and erase one with everything it stored."""

from __future__ import annotations

import json
import uuid
from typing import Annotated

import typer

from ragservice.cli.common import cli_actor, console, database, fail, tenant_named
from ragservice.config import DEFAULT_TENANT_ID

app = typer.Typer(help="Tenants.", no_args_is_help=True)


@app.command("list")
def tenants_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False,
) -> None:
    """List tenants, tab-separated: name, id, created, collections, documents, active keys."""
    from ragservice.services import tenants

    with database() as db, db.owner() as session:
        rows = tenants.list_tenants(session)
    listed = [
        {
            "name": t.name,
            "id": str(t.id),
            "created": t.created_at.isoformat(timespec="seconds"),
            "collections": t.collections,
            "documents": t.documents,
            "active_keys": t.active_keys,
        }
        for t in rows
    ]
    if as_json:
        typer.echo(json.dumps(listed, indent=2))
        return
    for row in listed:
        typer.echo("\t".join(str(value) for value in row.values()))


@app.command("create")
def tenants_create(name: str = typer.Argument(..., help="The tenant's name.")) -> None:
    """Create a tenant (nothing changes if it exists) and print its id. Then `ragservice ingest
    --tenant NAME` stores documents for it and `ragservice keys create --tenant NAME` makes its
    API keys."""
    from ragservice.services import tenants

    if not name.strip():
        raise typer.BadParameter("must not be empty", param_hint="NAME")
    with database() as db:
        tenant_id, created = tenants.create_tenant(db, name, actor=cli_actor())
    console.print(f"tenant {name!r} {'created' if created else 'exists'}")
    typer.echo(tenant_id)


@app.command("delete")
def tenants_delete(
    name: str = typer.Argument(..., help="The tenant's name."),
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Allow the default tenant: its rows are erased, the (empty) tenant stays.",
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the rows erased per table as a JSON object.")
    ] = False,
) -> None:
    """Erase a tenant: every row of every table that names it (collections, documents, chunks,
    embeddings, jobs and their uploads, API keys, the query log, feedback, cached answers,
    analyst bindings, ...), then the tenant itself, in one transaction. Prints the rows erased
    per table."""
    from ragservice.services import tenants

    with database() as db, db.owner() as session:
        tenant_id = tenant_named(session, name)
        default = tenant_id == uuid.UUID(DEFAULT_TENANT_ID)
        if default and not force:
            raise fail(
                "the default tenant serves the CLI and servers without authentication; "
                "--force erases its rows and keeps the tenant itself"
            )
        if not yes and not typer.confirm(f"Erase tenant {name!r} ({tenant_id}) for good?"):
            raise fail("nothing erased")
        erasure = tenants.erase_tenant(
            session, tenant_id, name, keep_tenant=default, actor=cli_actor()
        )
    erased, analysts = erasure.rows, erasure.analysts
    if as_json:
        typer.echo(json.dumps(dict(sorted(erased.items()))))
    else:
        for table, rows in sorted(erased.items()):
            typer.echo(f"{table}\t{rows}")
    console.print(f"erased tenant {name!r}: {sum(erased.values())} rows")
    if analysts:
        console.print(
            f"analyst logins bound to it now read nothing: {', '.join(analysts)} "
            "(ragservice analysts remove NAME drops one)"
        )
