"""The endpoints the web console needs: who the caller is, the embedding models, the prompt
cache's entries and the insights an analyst would read in SQL, each scoped to the caller."""

from __future__ import annotations

from fastapi.testclient import TestClient

from ragservice.api.app import create_app
from ragservice.config import DEFAULT_TENANT_ID, Settings
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from tests.api.conftest import Keys, ok


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
