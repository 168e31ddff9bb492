"""`ragservice keys`: create, list and revoke API keys."""

from __future__ import annotations

from typing import Annotated

import typer

from ragservice import store
from ragservice.auth.keys import Role
from ragservice.cli.common import console, database, fail

app = typer.Typer(help="API keys.", no_args_is_help=True)


@app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option("--tenant", help="Tenant name; created if new.")],
    role: Annotated[Role, typer.Option("--role", help="reader, writer or admin.")],
    name: Annotated[str | None, typer.Option("--name", help="A label for the key.")] = None,
) -> None:
    """Create an API key and print it once; only its hash is stored."""
    from ragservice.auth.keys import new_key

    key = new_key()
    with database() as db, db.write() as session:
        tenant_id = store.tenants.ensure_tenant(session, tenant)
        store.tenants.create_api_key(
            session, tenant_id=tenant_id, role=role, prefix=key.prefix, key_hash=key.hash, name=name
        )
    console.print(f"created a {role} key for tenant {tenant!r}; it is shown only this once:")
    typer.echo(key.secret)


@app.command("list")
def keys_list() -> None:
    """List keys (prefix, tenant, role, state); secrets are never shown again."""
    with database() as db, db.read() as session:
        rows = store.tenants.list_api_keys(session)
    for key, tenant in rows:
        state = "revoked" if key.revoked_at else "active"
        typer.echo(f"{key.prefix}\t{tenant}\t{key.role}\t{state}\t{key.name or ''}")


@app.command("revoke")
def keys_revoke(
    prefix: str = typer.Argument(..., help="The key's prefix, as `keys list` shows."),
) -> None:
    """Revoke a key; requests with it get 401 from then on."""
    with database() as db, db.write() as session:
        revoked = store.tenants.revoke_api_key(session, prefix)
    if not revoked:
        raise fail(f"no active key with prefix {prefix!r}")
    console.print(f"revoked {revoked} key(s)")
