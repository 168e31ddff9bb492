"""`ragservice search`, `ask` and `jobs` on the local store, in-process (the session's model
shared): each tenant's documents and jobs, the API's JSON, the errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ragservice import store
from ragservice.cli import app
from ragservice.config import get_settings
from ragservice.db import open_database, tenancy

pytestmark = pytest.mark.default_tenancy  # the commands say whose rows they work on


def ok(cli: CliRunner, *args: str) -> Any:
    result = cli.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture
def corpus(cli: CliRunner, tmp_path: Path) -> None:
    """Two documents of the default tenant, one of tenant acme."""
    default, acme = tmp_path / "default", tmp_path / "acme"
    default.mkdir()
    acme.mkdir()
    (default / "pumps.md").write_text("# Pumps\n\nCentrifugal pumps move water with an impeller.")
    (default / "valves.txt").write_text("Check valves stop water from flowing backwards.")
    (acme / "turbines.txt").write_text("Wind turbines turn water pumps on farms.")
    ok(cli, "tenants", "create", "acme")
    ok(cli, "ingest", str(default), "-c", "manuals")
    ok(cli, "ingest", str(acme), "-c", "farm", "--tenant", "acme")


def test_search_and_ask_each_tenants_collections(cli: CliRunner, corpus: None) -> None:
    found = json.loads(ok(cli, "search", "water pumps", "--json").stdout)
    assert {h["document"]["external_id"] for h in found["results"]} == {"pumps.md", "valves.txt"}
    assert found["embedding_model"]["name"].endswith("all-MiniLM-L6-v2")
    theirs = json.loads(ok(cli, "search", "water pumps", "--tenant", "acme", "--json").stdout)
    assert [h["document"]["external_id"] for h in theirs["results"]] == ["turbines.txt"]
    table = ok(cli, "search", "impeller", "-c", "manuals", "--mode", "fulltext", "-k", "1")
    assert "pumps.md" in table.stdout and "valves.txt" not in table.stdout

    asked = ok(cli, "ask", "What moves water with an impeller?", "-k", "1")
    answer, _, citations = asked.stdout.partition("\n\n")
    assert "Centrifugal pumps move water" in answer
    assert citations == "[1] Pumps (pumps.md)\n"
    whole = json.loads(ok(cli, "ask", "What moves water?", "-k", "1", "--json").stdout)
    assert whole["status"] == "extractive" and whole["answer"]
    assert whole["citations"][0]["document"]["external_id"] in ("pumps.md", "valves.txt")

    missing = cli.invoke(app, ["search", "x", "-c", "farm"])  # the default tenant has none
    assert missing.exit_code == 1 and "farm" in missing.stderr
    refused = cli.invoke(app, ["ask", "x", "--url", "http://127.0.0.1:9", "--tenant", "acme"])
    assert refused.exit_code == 2 and "the API key decides the tenant" in refused.stderr


def test_jobs_list_show_and_retry(cli: CliRunner, corpus: None) -> None:
    every = json.loads(ok(cli, "jobs", "list", "--json").stdout)
    assert sorted((j["tenant"], j["collection"], j["status"]) for j in every) == [
        ("acme", "farm", "done"),
        ("default", "manuals", "done"),
    ]
    (acme,) = json.loads(ok(cli, "jobs", "list", "--tenant", "acme", "--json").stdout)
    assert acme["counts"]["new"] == 1 and acme["kind"] == "cli"
    assert json.loads(ok(cli, "jobs", "list", "--status", "failed", "--json").stdout) == []
    (manuals,) = json.loads(ok(cli, "jobs", "list", "-c", "manuals", "--json").stdout)
    assert manuals["tenant"] == "default"
    assert ok(cli, "jobs", "list").stdout.count("\tcli\t") == 2

    shown = ok(cli, "jobs", "show", acme["id"]).stdout
    assert "where:     acme/farm" in shown and "new 1" in shown
    assert cli.invoke(app, ["jobs", "show", acme["id"], "--tenant", "default"]).exit_code == 1
    refused = cli.invoke(app, ["jobs", "retry", acme["id"]])
    assert refused.exit_code == 1 and "is done; only a failed job" in refused.stderr

    failed = failed_upload()
    queued = json.loads(ok(cli, "jobs", "retry", str(failed), "--json").stdout)
    assert (queued["status"], queued["attempts"], queued["tenant"]) == ("queued", 0, "acme")
    again = cli.invoke(app, ["jobs", "retry", str(failed)])
    assert again.exit_code == 1 and "is queued; only a failed job" in again.stderr


def failed_upload() -> Any:
    """An upload job of tenant acme that failed, its items kept (in the commands' database)."""
    db = open_database(get_settings(), route_reads=False)
    item = store.jobs.JobItem(kind="text", name="t", title=None, body=b"text")
    try:
        with tenancy.as_system(), db.write() as session:
            tenant_id = store.tenants.find_tenant_id(session, "acme")
            assert tenant_id is not None
            job_id = store.jobs.enqueue_job(
                session,
                tenant_id=tenant_id,
                collection_id=store.collections.ensure_collection(session, tenant_id, "farm"),
                kind="upload",
                params={},
                items=[item],
            )
            store.jobs.finish_job(session, job_id, status="failed", counts={}, errors=[])
    finally:
        db.dispose()
    return job_id
