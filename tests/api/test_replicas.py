"""Reads through real streaming replicas: routing, lag, read-your-writes, failover and recovery.

One app for the module, on the `dev_cluster` fixture (an embedded primary with standbys `eu-1`
and `us-1`); the server's region is `eu`. Each test leaves both standbys running and replaying.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from ragservice.api.app import create_app
from ragservice.config import Settings
from ragservice.db.scope import format_lsn, parse_lsn
from ragservice.dev.cluster import DevCluster, Standby
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from tests.api.conftest import ok, wait_for_job

MAX_LAG = 0.5
WAIT = 0.3
TOKEN = "X-Consistency-Token"
NODE = "X-Read-Node"


@pytest.fixture(scope="module")
def replica_client(
    dev_cluster: DevCluster,
    embedder: SentenceTransformerEmbedder,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[TestClient]:
    from ingest.worker import JobWorker

    # No database URL: the cluster's primary is the embedded server in its data folder, which
    # gives the service a login of its own (the cluster's URLs are its administrator's).
    settings = Settings(
        replicas=dev_cluster.replicas_setting(),
        region="eu",
        replica_check_seconds=0.1,
        replica_max_lag_seconds=MAX_LAG,
        replica_wait_seconds=WAIT,
        auth_disabled=True,
        data_dir=dev_cluster.data_dir,
        job_poll_seconds=0.2,
        workers=1,
    )
    app = create_app(settings, embedder=embedder, services=[JobWorker])
    with TestClient(app, raise_server_exceptions=False) as client:
        wait_until(lambda: serving(client) == {"eu-1", "us-1"})
        yield client


@pytest.fixture
def standbys(dev_cluster: DevCluster) -> Iterator[dict[str, Standby]]:
    """The standbys by name; whatever a test did to them is undone afterwards."""
    by_name = {standby.name: standby for standby in dev_cluster.standbys}
    yield by_name
    for standby in by_name.values():
        standby.start()
        execute(standby, "SELECT pg_wal_replay_resume()")


def execute(standby: Standby, statement: str) -> Any:
    url = standby.url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(statement).fetchone()
    return None if row is None else row[0]


def replayed(standby: Standby) -> int:
    """How far `standby` has replayed the primary's WAL."""
    return parse_lsn(str(execute(standby, "SELECT pg_last_wal_replay_lsn()")))


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> float:
    """Seconds it took `condition` to hold; fails after `timeout`."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not true after {timeout} s")
        time.sleep(0.02)
    return time.monotonic() - started


def nodes(client: TestClient) -> dict[str, dict[str, Any]]:
    return {node["name"]: node for node in ok(client.get("/v1/admin/health"))["nodes"]}


def replica_gauges(client: TestClient) -> dict[tuple[str, str], float]:
    """(gauge, node) → value of the replica gauges and read counts in `/metrics`."""
    gauges = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name.startswith("ragservice_replica_"):
                gauges[
                    sample.name.removeprefix("ragservice_replica_"), sample.labels["replica"]
                ] = sample.value
            elif sample.name == "ragservice_db_reads_total":
                gauges["reads", sample.labels["node"]] = sample.value
    return gauges


def serving(client: TestClient) -> set[str]:
    return {name for name, node in nodes(client).items() if node.get("serving")}


def new_collection(client: TestClient) -> tuple[str, str]:
    """A collection made on the primary, and the consistency token of that write."""
    name = f"c{uuid.uuid4().hex[:10]}"
    response = client.post("/v1/collections", json={"name": name})
    ok(response, 201)
    return name, response.headers[TOKEN]


def set_ttl(client: TestClient, name: str, seconds: int) -> str:
    response = client.patch(f"/v1/collections/{name}", json={"cache_ttl_seconds": seconds})
    ok(response)
    return response.headers[TOKEN]


def test_reads_go_to_the_local_replica_and_writes_return_a_token(
    replica_client: TestClient,
) -> None:
    name, token = new_collection(replica_client)
    assert parse_lsn(token) > 0
    response = replica_client.get(f"/v1/collections/{name}", headers={TOKEN: token})
    assert ok(response)["name"] == name
    assert response.headers[NODE] == "eu-1"
    # A request that writes reads on the primary too: it never acts on a stale view.
    unchanged = {"cache_ttl_seconds": None}
    patched = replica_client.patch(f"/v1/collections/{name}", json=unchanged)
    assert ok(patched)["name"] == name
    assert patched.headers[NODE] == "primary"
    listing = replica_client.get("/v1/collections")
    assert listing.headers[NODE] == "eu-1"
    assert TOKEN not in listing.headers  # a read writes nothing


def test_search_and_query_are_served_by_the_replica(replica_client: TestClient) -> None:
    name, _ = new_collection(replica_client)
    documents = [
        {"external_id": "wal", "text": "Standbys replay the write-ahead log of the primary."},
        {"external_id": "hnsw", "text": "HNSW graphs answer nearest-neighbour queries fast."},
    ]
    job = replica_client.post(f"/v1/collections/{name}/documents", json={"documents": documents})
    assert wait_for_job(replica_client, ok(job, 202)["id"], {})["status"] == "done"
    found = replica_client.post(
        "/v1/search", json={"query": "write-ahead log replay", "collections": [name], "k": 1}
    )
    assert ok(found)["results"][0]["document"]["external_id"] == "wal"
    assert found.headers[NODE] == "eu-1"
    question = {"question": "What do standbys replay?", "collections": [name], "k": 1}
    answered = replica_client.post("/v1/query", json=question)
    assert "write-ahead log" in ok(answered)["answer"]
    assert answered.headers[NODE] == "eu-1"
    # The query log and the cache store went to the primary after the response; the replica
    # serves the entry once it has replayed that write (no token: the write had none to give).
    wait_until(lambda: ok(replica_client.post("/v1/query", json=question))["cache"]["hit"])


def test_a_token_read_waits_for_the_replica_then_falls_back_to_the_primary(
    replica_client: TestClient, standbys: dict[str, Standby]
) -> None:
    name, _ = new_collection(replica_client)
    wait_until(lambda: serving(replica_client) == {"eu-1", "us-1"})
    for standby in standbys.values():
        execute(standby, "SELECT pg_wal_replay_pause()")
    token = set_ttl(replica_client, name, 111)

    started = time.monotonic()
    response = replica_client.get(f"/v1/collections/{name}", headers={TOKEN: token})
    waited = time.monotonic() - started
    assert ok(response)["cache_ttl_seconds"] == 111  # the write, seen
    assert response.headers[NODE] == "primary"  # no replica had it within the bound
    assert WAIT * 0.8 <= waited < WAIT + 2.0

    for standby in standbys.values():
        execute(standby, "SELECT pg_wal_replay_resume()")
    response = replica_client.get(f"/v1/collections/{name}", headers={TOKEN: token})
    assert ok(response)["cache_ttl_seconds"] == 111
    assert response.headers[NODE] in ("eu-1", "us-1")


def test_a_lagging_replica_is_avoided_and_taken_back(
    replica_client: TestClient, standbys: dict[str, Standby]
) -> None:
    name, _ = new_collection(replica_client)
    execute(standbys["eu-1"], "SELECT pg_wal_replay_pause()")
    set_ttl(replica_client, name, 222)  # the primary moves on; eu-1 does not
    wait_until(lambda: "eu-1" not in serving(replica_client))
    lagging = nodes(replica_client)["eu-1"]
    assert lagging["healthy"] is True
    assert lagging["replay_paused"] is True
    assert lagging["lag_seconds"] > MAX_LAG
    assert lagging["lag_bytes"] > 0

    # Without a token: still served, from the other replica, and with no error.
    response = replica_client.get(f"/v1/collections/{name}")
    assert ok(response)["cache_ttl_seconds"] == 222
    assert response.headers[NODE] == "us-1"

    # The metrics say the same, from the router's last checks.
    gauges = replica_gauges(replica_client)
    assert (gauges["healthy", "eu-1"], gauges["serving", "eu-1"]) == (1, 0)
    assert gauges["lag_seconds", "eu-1"] > MAX_LAG and gauges["lag_bytes", "eu-1"] > 0
    assert gauges["serving", "us-1"] == 1
    assert gauges["reads", "us-1"] >= 1

    execute(standbys["eu-1"], "SELECT pg_wal_replay_resume()")
    wait_until(lambda: "eu-1" in serving(replica_client))
    assert replica_client.get(f"/v1/collections/{name}").headers[NODE] == "eu-1"


def test_a_stopped_replica_is_avoided_at_once_and_used_again_after_it_starts(
    replica_client: TestClient, standbys: dict[str, Standby]
) -> None:
    name, token = new_collection(replica_client)
    # us-1 has the write before eu-1 stops: the read below goes there whatever the load, not to
    # the primary after waiting out a slow replay (this test is about the stop, not the lag).
    wait_until(lambda: replayed(standbys["us-1"]) >= parse_lsn(token))
    standbys["eu-1"].stop()
    response = replica_client.get(f"/v1/collections/{name}", headers={TOKEN: token})
    assert ok(response)["name"] == name  # the first read after the stop already succeeds
    assert response.headers[NODE] == "us-1"
    down = nodes(replica_client)["eu-1"]
    assert down["healthy"] is False and down["error"]

    standbys["us-1"].stop()
    response = replica_client.get(f"/v1/collections/{name}")
    assert ok(response)["name"] == name
    assert response.headers[NODE] == "primary"

    for standby in standbys.values():
        standby.start()
    wait_until(lambda: serving(replica_client) == {"eu-1", "us-1"}, timeout=20)
    assert replica_client.get(f"/v1/collections/{name}").headers[NODE] == "eu-1"


def test_a_token_ahead_of_the_primary_is_ignored(replica_client: TestClient) -> None:
    wait_until(lambda: serving(replica_client) == {"eu-1", "us-1"})
    forged = format_lsn(parse_lsn("FFFF/0"))  # well formed, but no primary got there
    response = replica_client.get("/v1/collections", headers={TOKEN: forged})
    ok(response)
    # Honoured, it would have held a replica connection for WAIT s and then, no replica ever
    # getting there, gone to the primary: served by the replica, it was not waited for.
    assert response.headers[NODE] == "eu-1"


def test_a_bad_token_is_a_400(replica_client: TestClient) -> None:
    response = replica_client.get("/v1/collections", headers={TOKEN: "yesterday"})
    assert response.status_code == 400
    assert response.json()["error"] == "BadRequest"
    assert TOKEN.lower() in response.json()["detail"]


def test_readiness_lists_every_node(replica_client: TestClient) -> None:
    listed = nodes(replica_client)
    assert set(listed) == {"primary", "eu-1", "us-1"}
    assert listed["primary"]["role"] == "primary"
    assert listed["eu-1"]["local"] is True and listed["us-1"]["local"] is False
    assert listed["us-1"]["region"] == "us"
    assert "@" not in listed["eu-1"]["url"] or ":***@" in listed["eu-1"]["url"]
    replayed = parse_lsn(listed["eu-1"]["lsn"])
    assert format_lsn(replayed) == listed["eu-1"]["lsn"]


def test_replicas_status_command(
    dev_cluster: DevCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from ragservice.cli import app
    from ragservice.config import get_settings

    monkeypatch.setenv("RAGSERVICE_DATABASE_URL", dev_cluster.primary_url)
    monkeypatch.setenv("RAGSERVICE_REPLICAS", dev_cluster.replicas_setting())
    monkeypatch.setenv("RAGSERVICE_REGION", "eu")
    monkeypatch.setenv("RAGSERVICE_DATA_DIR", str(tmp_path))
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(app, ["replicas", "status", "--json"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    listed = {node["name"]: node for node in json.loads(result.stdout)}
    assert listed["eu-1"]["serving"] is True
    assert listed["us-1"]["role"] == "replica"


def test_api_keys_are_looked_up_on_the_primary(
    dev_cluster: DevCluster,
    embedder: SentenceTransformerEmbedder,
    standbys: dict[str, Standby],
    tmp_path: Path,
) -> None:
    """A key made while both replicas have stopped replaying works at once, and a revoked one
    stops at once: neither waits for a replica to catch up."""
    from ragservice import store
    from ragservice.auth.keys import new_key
    from ragservice.db import tenancy

    settings = Settings(
        replicas=dev_cluster.replicas_setting(),
        region="eu",
        replica_check_seconds=0.1,
        replica_max_lag_seconds=60,  # a paused replica stays in use for reads
        auth_disabled=False,
        data_dir=dev_cluster.data_dir,  # its primary, as in `replica_client`
    )
    with TestClient(create_app(settings, embedder=embedder), raise_server_exceptions=False) as c:
        wait_until(lambda: serving_with(c) == {"eu-1", "us-1"})
        for standby in standbys.values():
            execute(standby, "SELECT pg_wal_replay_pause()")
        key = new_key()
        db = c.app.state.runtime.db  # type: ignore[attr-defined]
        with tenancy.as_system(), db.write() as session:
            tenant_id = store.tenants.ensure_tenant(session, "acme")
            store.tenants.create_api_key(
                session, tenant_id=tenant_id, role="reader", prefix=key.prefix, key_hash=key.hash
            )
        headers = {"Authorization": f"Bearer {key.secret}"}
        response = c.get("/v1/collections", headers=headers)
        assert ok(response) == {"collections": []}
        assert response.headers[NODE] in ("eu-1", "us-1")  # the request's reads: a replica

        with tenancy.as_system(), db.write() as session:
            assert len(store.tenants.revoke_api_key(session, key.prefix)) == 1
        assert c.get("/v1/collections", headers=headers).status_code == 401


def serving_with(client: TestClient) -> set[str]:
    """The replicas serving reads, from the router itself (this app has no admin key)."""
    router = client.app.state.runtime.db.router  # type: ignore[attr-defined]
    return {node["name"] for node in router.status() if node.get("serving")}
