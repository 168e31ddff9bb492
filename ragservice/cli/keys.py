"""`ragservice keys`: create, list and revoke API keys (each creation and revocation is in the
audit log)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from ragservice.auth.keys import Role
from ragservice.cli.common import cli_actor, console, database, fail, iso_time
from ragservice.errors import InvalidInputError
from ragservice.readers import check_name

app = typer.Typer(help="API keys.", no_args_is_help=True)

_DURATION = re.compile(r"(\d+)([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: str) -> timedelta:
    """`90s`, `15m`, `12h`, `30d` → a timedelta; BadParameter for anything else."""
    match = _DURATION.fullmatch(value.strip())
    if match is None or int(match.group(1)) == 0:
        raise typer.BadParameter(
            f"{value!r} is not a duration such as 90s, 15m, 12h or 30d", param_hint="--expires-in"
        )
    return timedelta(seconds=int(match.group(1)) * _UNIT_SECONDS[match.group(2)])


def expiry(expires_in: str | None, expires_at: str | None) -> datetime | None:
    """When a new key stops working: at most one of --expires-in and --expires-at; none: never."""
    if expires_in is not None and expires_at is not None:
        raise typer.BadParameter(
            "give --expires-in or --expires-at, not both", param_hint="--expires-in"
        )
    if expires_in is not None:
        return datetime.now(UTC) + parse_duration(expires_in)
    at = iso_time(expires_at, "--expires-at")
    if at is None:
        return None
    at = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    if at <= datetime.now(UTC):
        raise typer.BadParameter(f"{expires_at!r} is in the past", param_hint="--expires-at")
    return at


@app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option("--tenant", help="Tenant name; created if new.")],
    role: Annotated[Role, typer.Option("--role", help="reader, writer or admin.")],
    name: Annotated[str | None, typer.Option("--name", help="A label for the key.")] = None,
    expires_in: Annotated[
        str | None,
        typer.Option("--expires-in", help="Lifetime, e.g. 12h or 90d (default: no expiry)."),
    ] = None,
    expires_at: Annotated[
        str | None,
        typer.Option("--expires-at", help="End of life as an ISO time (UTC unless it says)."),
    ] = None,
    user: Annotated[
        str | None,
        typer.Option(
            "--user",
            help="The user the key acts for: it reads the documents that user and the "
            "user's groups may read (default: no user; see docs/permissions.md).",
        ),
    ] = None,
) -> None:
    """Create an API key and print it once; only its hash is stored."""
    from ragservice.services import keys

    user_name = _user_name(user)
    ends = expiry(expires_in, expires_at)
    with database() as db:
        key = keys.create_key(
            db, tenant, role, actor=cli_actor(), name=name, expires_at=ends, user_name=user_name
        )
    until = "" if ends is None else f", valid until {_iso(ends)}"
    acting = "" if user_name is None else f" acting for user {user_name!r}"
    console.print(
        f"created a {role} key for tenant {tenant!r}{acting}{until}; it is shown only this once:"
    )
    typer.echo(key.secret)


@app.command("list")
def keys_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False,
) -> None:
    """List keys, tab-separated: prefix, tenant, role, state (active, expired, revoked), name,
    expires at, last used (to the minute), the user it acts for; secrets are never shown again."""
    from ragservice.services import keys

    with database() as db:
        rows = keys.list_keys(db)
    now = datetime.now(UTC)
    listed = []
    for key, tenant in rows:
        state = "active"
        if key.revoked_at:
            state = "revoked"
        elif key.expires_at is not None and key.expires_at <= now:
            state = "expired"
        listed.append(
            {
                "prefix": key.prefix,
                "tenant": tenant,
                "role": key.role,
                "state": state,
                "name": key.name,
                "expires_at": _iso(key.expires_at),
                "last_used_at": _iso(key.last_used_at),
                "user": key.user_name,
            }
        )
    if as_json:
        typer.echo(json.dumps(listed, indent=2))
        return
    for row in listed:
        typer.echo("\t".join(_cell(value) for value in row.values()))


def _cell(value: str | None) -> str:
    return "-" if value is None else value


@app.command("revoke")
def keys_revoke(
    prefix: str = typer.Argument(..., help="The key's prefix, as `keys list` shows."),
) -> None:
    """Revoke a key; requests with it get 401 from then on."""
    from ragservice.services import keys

    with database() as db:
        revoked = keys.revoke_keys(db, prefix, actor=cli_actor())
    if not revoked:
        raise fail(f"no active key with prefix {prefix!r}")
    console.print(f"revoked {len(revoked)} key(s)")


def _user_name(user: str | None) -> str | None:
    if user is None:
        return None
    try:
        return check_name(user.strip(), "user")
    except InvalidInputError as exc:
        raise typer.BadParameter(str(exc), param_hint="--user") from None


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.astimezone(UTC).isoformat(timespec="seconds")
