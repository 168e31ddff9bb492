"""`ragservice groups`: which users of a tenant belong to which groups (documents list groups
among their readers; docs/permissions.md). Each change is in the audit log."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from ragservice.cli.common import cli_actor, console, database, tenant_id_of
from ragservice.errors import InvalidInputError
from ragservice.readers import check_name

if TYPE_CHECKING:
    from ragservice.db import Database
    from ragservice.services.callers import Operator

app = typer.Typer(help="Groups of users, for document permissions.", no_args_is_help=True)

TenantOption = Annotated[str, typer.Option("--tenant", help="The tenant's name.")]


@app.command("add")
def groups_add(
    group: Annotated[str, typer.Argument(help="The group's name, e.g. hr.")],
    users: Annotated[list[str], typer.Argument(help="Users to add to it.")],
    tenant: TenantOption,
) -> None:
    """Add users to a group (the group exists once it has a member)."""
    from ragservice.services import groups

    added = _change(group, users, tenant, groups.add_members)
    console.print(f"added {added} user(s) to group {group.strip()!r} of tenant {tenant!r}")


@app.command("remove")
def groups_remove(
    group: Annotated[str, typer.Argument(help="The group's name.")],
    users: Annotated[list[str], typer.Argument(help="Users to remove from it.")],
    tenant: TenantOption,
) -> None:
    """Remove users from a group; they stop reading its documents at their next request."""
    from ragservice.services import groups

    removed = _change(group, users, tenant, groups.remove_members)
    console.print(f"removed {removed} user(s) from group {group.strip()!r} of tenant {tenant!r}")


@app.command("list")
def groups_list(
    tenant: TenantOption,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object.")] = False,
) -> None:
    """Every group of the tenant with its users, one group a line: name, then its users."""
    from ragservice.services import groups

    with database() as db:
        members = groups.members(db, tenant_id_of(db, tenant, _HINT))
    if as_json:
        typer.echo(json.dumps(members, indent=2))
        return
    for group, users in members.items():
        typer.echo("\t".join([group, ",".join(users)]))


def _names(group: str, users: list[str]) -> tuple[str, list[str]]:
    try:
        return check_name(group.strip(), "group"), sorted(
            {check_name(u.strip(), "user") for u in users}
        )
    except InvalidInputError as exc:
        raise typer.BadParameter(str(exc)) from None


_HINT = " (see `ragservice tenants list`)"


def _change(
    group: str,
    users: list[str],
    tenant: str,
    change: Callable[[Database, Operator, str, list[str]], int],
) -> int:
    """Apply a change of the group's members (audited with it); how many users it changed."""
    from ragservice.services.callers import Operator

    group_name, names = _names(group, users)
    with database() as db:
        operator = Operator(tenant_id=tenant_id_of(db, tenant, _HINT), actor=cli_actor())
        return change(db, operator, group_name, names)
