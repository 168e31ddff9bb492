"""API keys over HTTP: 401 without a valid key, 403 for a weak role, tenants never mix."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from ragservice import store
from ragservice.api.app import check_auth_binding, create_app
from ragservice.config import Settings
from ragservice.db import tenancy
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from ragservice.errors import ConfigurationError
from tests.api.conftest import Keys, ok, wait_for_job


def test_requests_without_a_valid_key_get_401(client: TestClient, keys: Keys) -> None:
    missing = client.get("/v1/collections")
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert missing.json()["error"] == "Authentication"
    assert client.get("/v1/collections", headers={"X-API-Key": "rsk_nope"}).status_code == 401
    wrong = client.get("/v1/collections", headers={"Authorization": "Bearer rsk_wrong"})
    assert wrong.status_code == 401
    assert "unknown or revoked" in wrong.json()["detail"]
    # Health stays open for load balancers.
    assert client.get("/healthz").status_code == 200


def test_x_api_key_header_works_and_revoked_keys_stop_working(
    client: TestClient, keys: Keys
) -> None:
    secret = keys.reader["Authorization"].removeprefix("Bearer ")
    ok(client.get("/v1/collections", headers={"X-API-Key": secret}))
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.write() as session:
        assert len(store.tenants.revoke_api_key(session, secret[:12])) == 1
    assert client.get("/v1/collections", headers={"X-API-Key": secret}).status_code == 401


def test_roles_limit_what_a_key_may_do(client: TestClient, keys: Keys) -> None:
    denied = client.post("/v1/collections", json={"name": "docs"}, headers=keys.reader)
    assert denied.status_code == 403
    assert "writer" in denied.json()["detail"]
    ok(client.post("/v1/collections", json={"name": "docs"}, headers=keys.writer), 201)
    ok(client.get("/v1/collections/docs", headers=keys.reader))
    docs = {"documents": [{"text": "hello"}]}
    assert (
        client.post("/v1/collections/docs/documents", json=docs, headers=keys.reader).status_code
        == 403
    )
    assert client.delete("/v1/collections/docs", headers=keys.writer).status_code == 403
    ok(client.delete("/v1/collections/docs", headers=keys.admin), 204)


def test_a_tenant_never_sees_another_tenants_data(client: TestClient, keys: Keys) -> None:
    ok(client.post("/v1/collections", json={"name": "docs"}, headers=keys.writer), 201)
    job = ok(
        client.post(
            "/v1/collections/docs/documents",
            json={"documents": [{"external_id": "a", "text": "Secret acme roadmap for 2027."}]},
            headers=keys.writer,
        ),
        202,
    )
    assert wait_for_job(client, job["id"], keys.writer)["status"] == "done"
    other = keys.other_tenant
    assert ok(client.get("/v1/collections", headers=other)) == {"collections": []}
    assert client.get("/v1/collections/docs", headers=other).status_code == 404
    assert client.get("/v1/collections/docs/documents", headers=other).status_code == 404
    assert client.get("/v1/collections/docs/documents/a", headers=other).status_code == 404
    assert client.delete("/v1/collections/docs", headers=other).status_code == 404
    assert client.get(f"/v1/jobs/{job['id']}", headers=other).status_code == 404
    assert ok(client.get("/v1/jobs", headers=other)) == {"jobs": []}
    search = {"query": "acme roadmap", "collections": ["docs"]}
    assert client.post("/v1/search", json=search, headers=other).status_code == 404
    everything = ok(client.post("/v1/search", json={"query": "acme roadmap"}, headers=other))
    assert everything["results"] == []
    # The same name is free in another tenant, and stays separate.
    ok(client.post("/v1/collections", json={"name": "docs"}, headers=other), 201)
    theirs = ok(client.post("/v1/search", json=search, headers=other))
    assert theirs["results"] == []
    ours = ok(client.post("/v1/search", json=search, headers=keys.reader))
    assert [hit["document"]["external_id"] for hit in ours["results"]] == ["a"]


def test_auth_can_be_off_only_on_loopback(
    settings: Settings, embedder: SentenceTransformerEmbedder
) -> None:
    off = settings.model_copy(update={"auth_disabled": True})
    for host in ("0.0.0.0", "10.1.2.3", "example.com", "::"):
        with pytest.raises(ConfigurationError, match="loopback"):
            check_auth_binding(off.security, host)
    for host in ("127.0.0.1", "localhost", "::1"):
        check_auth_binding(off.security, host)
    with pytest.raises(ConfigurationError):
        create_app(off.model_copy(update={"host": "0.0.0.0"}), embedder=embedder)
    with TestClient(create_app(off, embedder=embedder)) as client:
        created = ok(client.post("/v1/collections", json={"name": "local"}), 201)
        assert created["name"] == "local"
