"""GET /v1/audit: admin actions of the caller's tenant, for its admin keys only, in pages."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.api.conftest import Keys, ok


def test_admin_actions_are_in_the_tenants_audit_log(client: TestClient, keys: Keys) -> None:
    for name in ("docs", "old"):
        ok(client.post("/v1/collections", json={"name": name}, headers=keys.writer), 201)
    ok(client.patch("/v1/collections/docs", json={"cache_ttl_seconds": 60}, headers=keys.admin))
    ok(client.delete("/v1/collections/docs/cache", headers=keys.admin))
    ok(client.delete("/v1/collections/old", headers=keys.admin), 204)
    assert client.delete("/v1/collections/nope", headers=keys.admin).status_code == 404
    export = client.get("/v1/feedback/export?format=triplets", headers=keys.admin)
    assert export.status_code == 200

    page = ok(client.get("/v1/audit", headers=keys.admin))
    actions = [(e["action"], e["target"]) for e in page["entries"]]
    assert actions == [
        ("feedback.export", "triplets"),
        ("collection.delete", "old"),
        ("cache.purge", "docs"),
        ("collection.update", "docs"),
    ]  # newest first; the failed delete left nothing
    prefix = keys.admin["Authorization"].removeprefix("Bearer ")[:12]
    assert {e["actor"] for e in page["entries"]} == {f"key:{prefix}"}
    assert page["entries"][2]["details"] == {"purged": 0}
    assert page["next_before"] is None

    first = ok(client.get("/v1/audit?limit=2", headers=keys.admin))
    assert [e["action"] for e in first["entries"]] == ["feedback.export", "collection.delete"]
    rest = ok(client.get(f"/v1/audit?limit=2&before={first['next_before']}", headers=keys.admin))
    assert [e["action"] for e in rest["entries"]] == ["cache.purge", "collection.update"]


def test_only_admins_read_the_audit_log_and_only_their_tenants(
    client: TestClient, keys: Keys
) -> None:
    ok(client.post("/v1/collections", json={"name": "docs"}, headers=keys.writer), 201)
    ok(client.delete("/v1/collections/docs", headers=keys.admin), 204)
    assert client.get("/v1/audit").status_code == 401
    assert client.get("/v1/audit", headers=keys.reader).status_code == 403
    assert client.get("/v1/audit", headers=keys.writer).status_code == 403
    assert ok(client.get("/v1/audit", headers=keys.other_tenant)) == {
        "entries": [],
        "next_before": None,
    }
    too_many = client.get("/v1/audit?limit=501", headers=keys.admin)
    assert too_many.status_code == 422
    assert "limit" in too_many.json()["detail"]
    assert len(ok(client.get("/v1/audit", headers=keys.admin))["entries"]) == 1
