"""The endpoints the web console needs: who the caller is, the embedding models, the prompt
cache's entries and the insights an analyst would read in SQL, each scoped to the caller."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from ragservice import store
from ragservice.api.app import create_app
from ragservice.auth.keys import new_key
from ragservice.bootstrap import Runtime
from ragservice.config import DEFAULT_TENANT_ID, DEFAULT_TENANT_NAME, Settings
from ragservice.db import tenancy
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from tests.api.conftest import Keys, ok
from tests.api.test_query import add_corpus


def runtime_of(client: TestClient) -> Runtime:
    runtime: Runtime = client.app.state.runtime  # type: ignore[attr-defined]
    return runtime


def service_admin_key(client: TestClient) -> dict[str, str]:
    """An admin key of the default tenant: the service operator's."""
    key = new_key()
    with tenancy.as_system(), runtime_of(client).db.write() as session:
        tenant_id = store.tenants.ensure_tenant(session, DEFAULT_TENANT_NAME)
        store.tenants.create_api_key(
            session, tenant_id=tenant_id, role="admin", prefix=key.prefix, key_hash=key.hash
        )
    return {"Authorization": f"Bearer {key.secret}"}


def test_me_tells_the_tenant_role_and_limits(
    client: TestClient, keys: Keys, api_settings: Settings, embedder: SentenceTransformerEmbedder
) -> None:
    reader = ok(client.get("/v1/me", headers=keys.reader))
    assert reader["tenant"]["name"] == "acme"
    assert reader["role"] == "reader"
    assert reader["auth_disabled"] is False
    assert reader["service_admin"] is False
    assert reader["key_prefix"].startswith("rsk_")
    assert keys.reader["Authorization"].removeprefix("Bearer ").startswith(reader["key_prefix"])
    assert reader["max_file_bytes"] == api_settings.max_file_bytes
    assert reader["max_files_per_upload"] == api_settings.max_files_per_upload
    assert reader["cache_enabled"] is api_settings.cache_enabled
    assert reader["answer_model"] == "extractive"  # no upstream configured

    admin = ok(client.get("/v1/me", headers=keys.admin))
    assert (admin["role"], admin["tenant"]) == ("admin", reader["tenant"])
    assert admin["service_admin"] is False  # an admin of acme, not of the service
    other = ok(client.get("/v1/me", headers=keys.other_tenant))
    assert other["tenant"]["name"] == "globex"
    assert other["tenant"]["id"] != reader["tenant"]["id"]
    assert client.get("/v1/me").status_code == 401

    off = api_settings.model_copy(update={"auth_disabled": True})
    with TestClient(create_app(off, embedder=embedder)) as unauthenticated:
        me = ok(unauthenticated.get("/v1/me"))
    assert me["tenant"] == {"id": DEFAULT_TENANT_ID, "name": "default"}
    assert (me["role"], me["auth_disabled"], me["service_admin"]) == ("admin", True, True)
    assert me["key_prefix"] is None


def test_models_are_listed_to_admins_and_switched_by_the_service_admin_only(
    client: TestClient, keys: Keys, tiny_path: Path
) -> None:
    add_corpus(client, keys.writer)
    with tenancy.as_system(), runtime_of(client).db.write() as session:
        chunks = store.models.chunk_total(session)
        tiny = store.models.register_model_version(
            session,
            name="tiny",
            version=1,
            dimension=32,
            path=str(tiny_path),
            base_model_id=None,
            details={"held_out": {"before": {"ndcg@10": 0.5}, "after": {"ndcg@10": 0.6}}},
            hnsw_m=16,
            hnsw_ef_construction=64,
        )
        tiny_id = tiny.id
    service = service_admin_key(client)

    listed = ok(client.get("/v1/admin/models", headers=service))
    assert listed["can_switch"] is True
    by_name = {row["name"]: row for row in listed["models"]}
    served = next(row for row in listed["models"] if row["active"])
    assert (served["embedded"], served["chunks"]) == (chunks, chunks)
    assert by_name["tiny"]["held_out"] == {"before": {"ndcg@10": 0.5}, "after": {"ndcg@10": 0.6}}
    assert (by_name["tiny"]["active"], by_name["tiny"]["embedded"]) == (False, 0)
    assert "path" not in by_name["tiny"]
    acme = ok(client.get("/v1/admin/models", headers=keys.admin))
    assert acme["can_switch"] is False and len(acme["models"]) == len(listed["models"])
    # Another tenant's admin sees the models, never how much acme has embedded.
    globex = ok(client.get("/v1/admin/models", headers=keys.other_tenant))
    assert {row["chunks"] for row in globex["models"]} == {0}
    assert client.get("/v1/admin/models", headers=keys.writer).status_code == 403

    switch = {"model": "tiny:1"}
    refused = client.post("/v1/admin/models/activate", json=switch, headers=keys.other_tenant)
    assert refused.status_code == 403 and "default tenant" in refused.json()["detail"]
    assert (
        client.post("/v1/admin/models/activate", json=switch, headers=keys.admin).status_code == 403
    )
    assert client.post("/v1/admin/models/rollback", json={}, headers=keys.writer).status_code == 403
    unknown = client.post("/v1/admin/models/activate", json={"model": "nope"}, headers=service)
    assert unknown.status_code == 404
    missing = client.post("/v1/admin/models/activate", json=switch, headers=service)
    assert missing.status_code == 409
    assert f"no embedding for {chunks} chunks" in missing.json()["detail"]

    forced = ok(
        client.post("/v1/admin/models/activate", json={**switch, "force": True}, headers=service)
    )
    assert forced["changed"] is True and forced["previous_id"] == served["id"]
    assert (forced["model"]["id"], forced["model"]["active"]) == (tiny_id, True)
    back = ok(client.post("/v1/admin/models/rollback", json={}, headers=service))
    assert back["changed"] is True and back["previous_id"] == tiny_id
    assert (back["model"]["id"], back["model"]["active"]) == (served["id"], True)
    with tenancy.as_system(), runtime_of(client).db.read() as session:
        entries = store.audit.list_entries(session, None, limit=2)
    prefix = service["Authorization"].removeprefix("Bearer ")[:12]
    assert [(e.action, e.actor, e.tenant_id) for e in entries] == [
        ("model.rollback", f"key:{prefix}", None),
        ("model.activate", f"key:{prefix}", None),
    ]
    assert all(e.key_id is not None for e in entries)
