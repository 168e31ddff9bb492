"""Per-document readers on a streaming replica: a search, an answer (a cached one included)
and a document read served by a replica (`X-Read-Node`) hide a restricted document from a key
acting for a user outside its readers, as the primary does; the replica's transactions get the
caller's principal set too, computed on the primary (a group membership removed counts at once).
One app with authentication on, on the session's `dev_cluster`."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from ragservice import store
from ragservice.api.app import create_app
from ragservice.auth.keys import new_key
from ragservice.config import Settings
from ragservice.db import tenancy
from ragservice.dev.cluster import DevCluster
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from tests.api.conftest import ok
from tests.api.test_mcp_permissions import (
    COLLECTION,
    OPEN,
    QUESTION,
    RESTRICTED,
    Restricted,
    restricted_corpus,
    user_keys,
)
from tests.api.test_replicas import NODE, execute, serving_with, wait_until

REPLICAS = ("eu-1", "us-1")
DOCUMENT = f"/v1/collections/{COLLECTION}/documents"


@pytest.fixture(scope="module")
def cluster_client(
    dev_cluster: DevCluster, embedder: SentenceTransformerEmbedder
) -> Iterator[TestClient]:
    from ingest.worker import JobWorker

    settings = Settings(
        replicas=dev_cluster.replicas_setting(),
        region="eu",
        replica_check_seconds=0.1,
        replica_max_lag_seconds=5,
        auth_disabled=False,
        data_dir=dev_cluster.data_dir,  # its primary, as in tests/api/test_replicas.py
        job_poll_seconds=0.2,
        workers=1,
    )
    app = create_app(settings, embedder=embedder, services=[JobWorker])
    with TestClient(app, raise_server_exceptions=False) as client:
        wait_until(lambda: serving_with(client) == set(REPLICAS))
        yield client


@pytest.fixture
def paused(dev_cluster: DevCluster) -> Iterator[None]:
    """Both standbys stop replaying (and stay in use within the lag bound); afterwards they
    replay again."""
    for standby in dev_cluster.standbys:
        execute(standby, "SELECT pg_wal_replay_pause()")
    yield
    for standby in dev_cluster.standbys:
        execute(standby, "SELECT pg_wal_replay_resume()")


def admin_key(client: TestClient, tenant: str) -> dict[str, str]:
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    key = new_key()
    with tenancy.as_system(), db.write() as session:
        tenant_id = store.tenants.ensure_tenant(session, tenant)
        store.tenants.create_api_key(
            session, tenant_id=tenant_id, role="admin", prefix=key.prefix, key_hash=key.hash
        )
    return {"Authorization": f"Bearer {key.secret}"}


def on_a_replica(response: httpx.Response) -> Any:
    """The response's body, once its reads were served by a replica."""
    assert response.headers[NODE] in REPLICAS, response.headers.get(NODE)
    return ok(response)


def test_a_replica_hides_a_restricted_document_from_an_outsider(
    cluster_client: TestClient,
) -> None:
    client = cluster_client
    tenant = f"perm{uuid.uuid4().hex[:8]}"
    restricted: Restricted = restricted_corpus(client, admin_key(client, tenant))
    insider, outsider = user_keys(client, tenant)
    search = {"query": QUESTION, "collections": [COLLECTION], "k": 5, "mode": "fulltext"}

    def insider_sees_it_on_a_replica() -> bool:
        response = client.post("/v1/search", json=search, headers=insider)
        found = [hit["document"]["external_id"] for hit in ok(response)["results"]]
        return response.headers[NODE] in REPLICAS and RESTRICTED["external_id"] in found

    wait_until(insider_sees_it_on_a_replica)  # the replica has replayed the ingest
    opened = on_a_replica(client.get(f"{DOCUMENT}/{RESTRICTED['external_id']}", headers=insider))
    assert opened["title"] == RESTRICTED["title"]

    for mode in ("fulltext", "dense", "hybrid"):
        found = on_a_replica(
            client.post("/v1/search", json={**search, "mode": mode}, headers=outsider)
        )
        seen = [h["document"]["external_id"] for h in found["results"]]
        assert seen == ([] if mode == "fulltext" else ["canteen"]), mode  # no word in common
        assert restricted.hidden_in(found)
    # The insider's answer, cached (on the primary) and replayed: the replica serves it to
    # the insider only.
    question = {"question": QUESTION, "collections": [COLLECTION]}

    def asked(headers: dict[str, str]) -> Any:
        return on_a_replica(client.post("/v1/query", json=question, headers=headers))

    wait_until(lambda: bool(asked(insider)["cache"]["hit"]))
    answered = asked(outsider)
    assert answered["cache"]["hit"] is False
    assert restricted.hidden_in(answered)
    hidden = client.get(f"{DOCUMENT}/{RESTRICTED['external_id']}", headers=outsider)
    assert hidden.status_code == 404 and hidden.headers[NODE] in REPLICAS
    listed = on_a_replica(client.get(DOCUMENT, headers=outsider))
    assert [d["external_id"] for d in listed["documents"]] == [OPEN["external_id"]]
    assert restricted.hidden_in(listed)


def test_a_user_removed_from_a_group_stops_reading_on_a_stale_replica(
    cluster_client: TestClient, request: pytest.FixtureRequest
) -> None:
    """Group membership is read on the primary with the key, so a replica that has not
    replayed the removal still reads with the user's new principal set."""
    client = cluster_client
    tenant = f"perm{uuid.uuid4().hex[:8]}"
    restricted_corpus(client, admin_key(client, tenant))
    insider, _ = user_keys(client, tenant)
    path = f"{DOCUMENT}/{RESTRICTED['external_id']}"
    wait_until(lambda: readable_on_a_replica(client.get(path, headers=insider)))

    request.getfixturevalue("paused")
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.write() as session:
        tenant_id = store.tenants.find_tenant_id(session, tenant)
        assert tenant_id is not None
        assert store.tenants.remove_group_members(session, tenant_id, "hr", ["ana"]) == 1
    hidden = client.get(path, headers=insider)
    assert hidden.status_code == 404 and hidden.headers[NODE] in REPLICAS


def readable_on_a_replica(response: httpx.Response) -> bool:
    return response.status_code == 200 and response.headers[NODE] in REPLICAS
