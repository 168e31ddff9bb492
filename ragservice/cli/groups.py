"""`ragservice groups`: which users of a tenant belong to which groups (documents list groups
among their readers; docs/permissions.md). Each change is in the audit log."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from ragservice.cli.common import cli_actor, console, database, fail
from ragservice.errors import InvalidInputError
from ragservice.readers import check_name

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

app = typer.Typer(help="Groups of users, for document permissions.", no_args_is_help=True)

TenantOption = Annotated[str, typer.Option("--tenant", help="The tenant's name.")]


@app.command("add")
def groups_add(
    group: Annotated[str, typer.Argument(help="The group's name, e.g. hr.")],
    users: Annotated[list[str], typer.Argument(help="Users to add to it.")],
    tenant: TenantOption,
) -> None:
    """Add users to a group (the group exists once it has a member)."""
    from ragservice import store

    added = _change(group, users, tenant, store.tenants.add_group_members, "group.add")
    console.print(f"added {added} user(s) to group {group.strip()!r} of tenant {tenant!r}")


@app.command("remove")
def groups_remove(
    group: Annotated[str, typer.Argument(help="The group's name.")],
    users: Annotated[list[str], typer.Argument(help="Users to remove from it.")],
    tenant: TenantOption,
) -> None:
    """Remove users from a group; they stop reading its documents at their next request."""
    from ragservice import store

    removed = _change(group, users, tenant, store.tenants.remove_group_members, "group.remove")
    console.print(f"removed {removed} user(s) from group {group.strip()!r} of tenant {tenant!r}")


@app.command("list")
def groups_list(
    tenant: TenantOption,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object.")] = False,
) -> None:
    """Every group of the tenant with its users, one group a line: name, then its users."""
    from ragservice import store
    from ragservice.db import tenancy

    with database() as db, tenancy.as_system(), db.read() as session:
        groups = store.tenants.group_members(session, _tenant_id(session, tenant))
    if as_json:
        typer.echo(json.dumps(groups, indent=2))
        return
    for group, members in groups.items():
        typer.echo("\t".join([group, ",".join(members)]))


def _names(group: str, users: list[str]) -> tuple[str, list[str]]:
    try:
        return check_name(group.strip(), "group"), sorted(
            {check_name(u.strip(), "user") for u in users}
        )
    except InvalidInputError as exc:
        raise typer.BadParameter(str(exc)) from None


def _tenant_id(session: Session, tenant: str) -> uuid.UUID:
    from ragservice import store

    tenant_id = store.tenants.find_tenant_id(session, tenant)
    if tenant_id is None:
        raise fail(f"no tenant named {tenant!r} (see `ragservice tenants list`)")
    return tenant_id


def _change(
    group: str,
    users: list[str],
    tenant: str,
    change: Callable[[Session, uuid.UUID, str, list[str]], int],
    action: str,
) -> int:
    """Apply a change of the group's members and audit it, in one transaction; how many
    users it changed."""
    from ragservice.db import tenancy
    from ragservice.services.callers import Operator, audit

    group_name, names = _names(group, users)
    with database() as db, tenancy.as_system(), db.write() as session:
        tenant_id = _tenant_id(session, tenant)
        changed = change(session, tenant_id, group_name, names)
        operator = Operator(tenant_id=tenant_id, actor=cli_actor())
        audit(session, operator, action, group_name, {"users": names})
    return changed
