"""`ragservice ingest --tenant`: documents the CLI stores are the named tenant's, seen by its
keys over the API and by no other tenant's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient

from tests.api.conftest import Keys, ok

BIN = Path(sys.executable).parent


def ingest(database_url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "RAGSERVICE_DATABASE_URL": database_url,
        "RAGSERVICE_DATA_DIR": str(tmp_path / "unused"),
        "HF_HUB_OFFLINE": "1",
        "COLUMNS": "200",
    }
    return subprocess.run(
        [str(BIN / "ragservice"), "ingest", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_cli_ingest_into_a_tenant_is_seen_by_its_keys_only(
    client: TestClient, keys: Keys, database_url: str, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "pumps.md").write_text("# Pumps\n\nCentrifugal pumps move water with an impeller.")
    (corpus / "valves.txt").write_text("Check valves stop water from flowing backwards.")
    # Two worker processes: the tenant reaches them too.
    args = (str(corpus), "-c", "manuals", "--tenant", "acme", "--workers", "2", "--json")
    done = ingest(database_url, tmp_path, *args)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)  # nothing else on stdout
    assert (summary["tenant"], summary["collection"], summary["ok"]) == ("acme", "manuals", True)
    assert summary["counts"]["new"] == 2 and summary["failures"] == []

    listed = ok(client.get("/v1/collections/manuals/documents", headers=keys.reader))
    assert sorted(d["external_id"] for d in listed["documents"]) == ["pumps.md", "valves.txt"]
    job = ok(client.get(f"/v1/jobs/{summary['job_id']}", headers=keys.reader))
    assert (job["kind"], job["status"], job["counts"]["new"]) == ("cli", "done", 2)
    hits = ok(client.post("/v1/search", json={"query": "impeller"}, headers=keys.reader))
    assert hits["results"][0]["document"]["external_id"] == "pumps.md"

    other = keys.other_tenant
    assert client.get("/v1/collections/manuals/documents", headers=other).status_code == 404
    assert client.get(f"/v1/jobs/{summary['job_id']}", headers=other).status_code == 404
    assert ok(client.post("/v1/search", json={"query": "impeller"}, headers=other))["results"] == []


def test_cli_ingest_refuses_a_tenant_that_does_not_exist(database_url: str, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("text")
    refused = ingest(database_url, tmp_path, str(tmp_path / "a.txt"), "-c", "c", "--tenant", "nope")
    assert refused.returncode == 1
    assert "no tenant named 'nope'" in refused.stderr
    assert "ragservice tenants create nope" in refused.stderr
    assert refused.stdout == ""
