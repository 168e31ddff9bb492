"""The listing and reporting commands' `--json`: one JSON document on stdout, nothing else."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ragservice.cli import app
from ragservice.config import get_settings


@pytest.fixture
def cli(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    monkeypatch.setenv("RAGSERVICE_DATABASE_URL", database_url)
    monkeypatch.setenv("RAGSERVICE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    get_settings.cache_clear()
    yield CliRunner()
    get_settings.cache_clear()


def invoke_json(cli: CliRunner, *args: str) -> Any:
    result = cli.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_tenants_create_then_list_keys_and_tenants_as_json(cli: CliRunner) -> None:
    created = cli.invoke(app, ["tenants", "create", "acme"])
    assert created.exit_code == 0, created.output
    assert "tenant 'acme' created" in created.stderr
    again = cli.invoke(app, ["tenants", "create", "acme"])
    assert "tenant 'acme' exists" in again.stderr
    assert again.stdout == created.stdout  # the same id
    made = cli.invoke(app, ["keys", "create", "--tenant", "acme", "--role", "reader"])
    assert made.exit_code == 0, made.output

    (key,) = invoke_json(cli, "keys", "list")
    assert (key["tenant"], key["role"], key["state"], key["expires_at"]) == (
        "acme",
        "reader",
        "active",
        None,
    )
    assert made.stdout.startswith(key["prefix"])
    tenants = {t["name"]: t for t in invoke_json(cli, "tenants", "list")}
    assert sorted(tenants) == ["acme", "default"]
    assert tenants["acme"]["id"] == created.stdout.strip()
    assert (tenants["acme"]["active_keys"], tenants["acme"]["documents"]) == (1, 0)
    entries = [
        json.loads(line)
        for line in cli.invoke(app, ["audit", "list", "--json"]).stdout.splitlines()
    ]
    assert [e["action"] for e in entries] == ["key.create", "tenant.create"]


def test_other_reports_as_json(cli: CliRunner) -> None:
    assert invoke_json(cli, "db", "purge") == {"query_log": 0, "feedback": 0, "ingest_job_items": 0}
    assert isinstance(invoke_json(cli, "analysts", "list"), list)
    cli.invoke(app, ["tenants", "create", "gone"])
    erased = invoke_json(cli, "tenants", "delete", "gone", "--yes")
    assert erased["tenants"] == 1
