"""`ragservice audit list`: the audit log of administrative actions, of every tenant or one."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from ragservice.cli.common import database, tenant_id_of

app = typer.Typer(help="The audit log of administrative actions.", no_args_is_help=True)


@app.command("list")
def audit_list(
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Only this tenant's entries (by name).")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000)] = 100,
    before: Annotated[
        int | None, typer.Option("--before", min=1, help="Entries older than this id.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Entries newest first, tab-separated: id, time, tenant id ("-": deployment-wide, e.g.
    model activations), actor, action, target, details."""
    from ragservice.services import admin

    with database() as db:
        tenant_id = None if tenant is None else tenant_id_of(db, tenant)
        entries = admin.audit_entries(db, tenant_id, limit=limit, before=before)
    for entry in entries:
        row = {
            "id": entry.id,
            "at": entry.at.isoformat(timespec="seconds"),
            "tenant_id": None if entry.tenant_id is None else str(entry.tenant_id),
            "actor": entry.actor,
            "action": entry.action,
            "target": entry.target,
            "details": entry.details,
        }
        if as_json:
            typer.echo(json.dumps(row))
        else:
            cells = [str(v) if v is not None else "-" for k, v in row.items() if k != "details"]
            typer.echo("\t".join([*cells, json.dumps(entry.details)]))
