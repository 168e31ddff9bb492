"""The audit log in the database and through the CLI: entries are tenant-scoped by row-level
security, append-only for the service role, and written by `keys` and `models` commands."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import ProgrammingError
from typer.testing import CliRunner

from ragservice import store
from ragservice.cli import app
from ragservice.cli.keys import parse_duration
from ragservice.config import DEFAULT_EMBEDDING_MODEL, get_settings
from ragservice.db import tenancy
from ragservice.embedding import registry
from ragservice.runtime import Runtime


def test_entries_are_seen_by_their_tenant_only_and_never_changed(runtime: Runtime) -> None:
    with tenancy.as_system(), runtime.db.write() as session:
        acme = store.tenants.ensure_tenant(session, "acme")
        globex = store.tenants.ensure_tenant(session, "globex")
        for tenant_id, target in ((acme, "a"), (globex, "g"), (None, "everyone")):
            store.audit.record(
                session, tenant_id=tenant_id, actor="cli:test", action="x.y", target=target
            )
    with tenancy.as_tenant(acme), runtime.db.read() as session:
        # No tenant filter in the call: row-level security alone keeps globex's rows out.
        seen = store.audit.list_entries(session, None, limit=10)
        assert [entry.target for entry in seen] == ["a"]
    with tenancy.as_system(), runtime.db.read() as session:
        everything = store.audit.list_entries(session, None, limit=10)
        assert [entry.target for entry in everything] == ["everyone", "g", "a"]
        older = store.audit.list_entries(session, None, limit=10, before=everything[1].id)
        assert [entry.target for entry in older] == ["a"]
    for statement in ("UPDATE audit_log SET actor = 'nobody'", "DELETE FROM audit_log"):
        with (
            pytest.raises(ProgrammingError, match="permission denied"),
            tenancy.as_system(),
            runtime.db.write() as session,
        ):
            session.execute(text(statement))


def test_a_model_activation_is_recorded_for_operators(runtime: Runtime) -> None:
    switch = registry.activate(runtime.db, DEFAULT_EMBEDDING_MODEL, actor="cli:ops")
    assert switch.changed is False
    with tenancy.as_system(), runtime.db.read() as session:
        (entry,) = store.audit.list_entries(session, None, limit=10)
    assert (entry.tenant_id, entry.actor, entry.action) == (None, "cli:ops", "model.activate")
    assert entry.target == f"{DEFAULT_EMBEDDING_MODEL}:1"
    assert entry.details == {"previous_id": switch.previous_id, "changed": False, "force": False}


@pytest.fixture
def cli(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    monkeypatch.setenv("RAGSERVICE_DATABASE_URL", database_url)
    monkeypatch.setenv("RAGSERVICE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")  # error messages on one line
    get_settings.cache_clear()
    yield CliRunner()
    get_settings.cache_clear()


def test_keys_expire_and_the_commands_are_audited(cli: CliRunner) -> None:
    created = cli.invoke(
        app, ["keys", "create", "--tenant", "acme", "--role", "admin", "--expires-in", "30d"]
    )
    assert created.exit_code == 0, created.output
    prefix = created.stdout.strip()[:12]
    (listed,) = cli.invoke(app, ["keys", "list"]).stdout.splitlines()
    fields = listed.split("\t")
    assert fields[:4] == [prefix, "acme", "admin", "active"]
    expires = datetime.fromisoformat(fields[5])
    assert abs(expires - (datetime.now(UTC) + timedelta(days=30))) < timedelta(minutes=1)
    assert fields[6] == "-"  # never used
    assert cli.invoke(app, ["keys", "revoke", prefix]).exit_code == 0

    listing = cli.invoke(app, ["audit", "list", "--tenant", "acme", "--json"])
    entries = [json.loads(line) for line in listing.stdout.splitlines()]
    assert [(e["action"], e["target"]) for e in entries] == [
        ("key.revoke", prefix),
        ("key.create", prefix),
    ]
    assert all(e["actor"].startswith("cli:") for e in entries)
    assert entries[1]["details"]["role"] == "admin"

    bad = cli.invoke(
        app, ["keys", "create", "--tenant", "acme", "--role", "reader", "--expires-in", "soon"]
    )
    assert bad.exit_code == 2 and "'soon' is not a duration" in bad.output
    assert len(cli.invoke(app, ["keys", "list"]).stdout.splitlines()) == 1  # nothing made


def test_durations() -> None:
    assert parse_duration("90s") == timedelta(seconds=90)
    assert parse_duration("12h") == timedelta(hours=12)
    assert parse_duration("30d") == timedelta(days=30)
