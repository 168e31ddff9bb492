"""Authentication before the body: the key is checked from the headers alone; a client address
that keeps sending bad keys is locked out without database reads; keys expire and remember
when they were last used."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from ragservice import store
from ragservice.api import authn
from ragservice.auth.keys import new_key
from ragservice.config import Settings
from ragservice.db import tenancy
from ragservice.db.models import ApiKey
from tests.api.conftest import Keys, ok

FAILURES_PER_MINUTE = 3


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"auth_failures_per_minute": FAILURES_PER_MINUTE})


def asgi_call(
    client: TestClient, method: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, int]:
    """Call the app directly: (the response's status, how many times it read the body)."""
    reads = 0
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("203.0.113.9", 5000),
        "server": ("testserver", 80),
    }
    assert client.portal is not None
    client.portal.call(client.app, scope, receive, send)
    return status, reads


def test_the_key_is_checked_before_the_body_is_read(client: TestClient, keys: Keys) -> None:
    broken = b'{"documents": [' + b"1," * 100_000  # not JSON: a 400 if it were parsed
    json_type = {"content-type": "application/json"}
    path = "/v1/collections/docs/documents"
    assert asgi_call(client, "POST", path, json_type, broken) == (401, 0)
    bad_key = {**json_type, "authorization": "Bearer rsk_not-a-key"}
    assert asgi_call(client, "POST", path, bad_key, broken) == (401, 0)
    # A consistency token is not looked at either: no read of any kind before the key.
    far_ahead = {**json_type, "x-consistency-token": "FFFF/0"}
    assert asgi_call(client, "GET", "/v1/collections", far_ahead, b"") == (401, 0)
    # With a good key the body is read (and found wanting).
    good = {**json_type, **{k.lower(): v for k, v in keys.writer.items()}}
    status, reads = asgi_call(client, "POST", path, good, broken)
    assert (status, reads) == (400, 1)


def test_bad_keys_lock_the_client_address_out_without_database_reads(
    client: TestClient, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    lookups: list[str] = []
    real_lookup = authn._lookup

    def counting(runtime: Any, key_hash: str) -> Any:
        lookups.append(key_hash)
        return real_lookup(runtime, key_hash)

    monkeypatch.setattr(authn, "_lookup", counting)
    ok(client.get("/v1/collections", headers=keys.reader))  # a good key is no failure
    for attempt in range(FAILURES_PER_MINUTE):
        wrong = {"Authorization": f"Bearer rsk_guess{attempt}"}
        assert client.get("/v1/collections", headers=wrong).status_code == 401
    assert len(lookups) == FAILURES_PER_MINUTE + 1

    locked = client.get("/v1/collections", headers={"Authorization": "Bearer rsk_guess9"})
    assert locked.status_code == 429
    assert int(locked.headers["retry-after"]) >= 1
    assert "RAGSERVICE_AUTH_FAILURES_PER_MINUTE" in locked.json()["detail"]
    # Locked out means no lookup at all, even for a good key, until a token is back.
    assert client.get("/v1/collections", headers=keys.reader).status_code == 429
    assert len(lookups) == FAILURES_PER_MINUTE + 1
    metrics = client.get("/metrics").text
    assert 'ragservice_auth_refused_requests_total{reason="locked_out"} 2.0' in metrics
    assert 'ragservice_auth_refused_requests_total{reason="unknown"} 3.0' in metrics


@pytest.fixture
def db(client: TestClient) -> Iterator[Any]:
    yield client.app.state.runtime.db  # type: ignore[attr-defined]


def make_key(db: Any, *, expires_at: datetime | None) -> tuple[dict[str, str], Any]:
    key = new_key()
    with tenancy.as_system(), db.write() as session:
        tenant_id = store.tenants.ensure_tenant(session, "acme")
        key_id = store.tenants.create_api_key(
            session,
            tenant_id=tenant_id,
            role="reader",
            prefix=key.prefix,
            key_hash=key.hash,
            expires_at=expires_at,
        )
    return {"Authorization": f"Bearer {key.secret}"}, key_id


def last_used(db: Any, key_id: Any) -> datetime | None:
    with tenancy.as_system(), db.read() as session:
        return session.get(ApiKey, key_id).last_used_at  # type: ignore[no-any-return, union-attr]


def test_expired_keys_get_401(client: TestClient, db: Any) -> None:
    now = datetime.now(UTC)
    expired, _ = make_key(db, expires_at=now - timedelta(seconds=1))
    refused = client.get("/v1/collections", headers=expired)
    assert refused.status_code == 401
    assert refused.json()["detail"].startswith("API key expired at ")
    current, _ = make_key(db, expires_at=now + timedelta(hours=1))
    ok(client.get("/v1/collections", headers=current))


def test_last_used_is_kept_to_the_minute(client: TestClient, db: Any) -> None:
    headers, key_id = make_key(db, expires_at=None)
    assert last_used(db, key_id) is None
    ok(client.get("/v1/collections", headers=headers))
    first = last_used(db, key_id)  # written after the response, before the call returned
    assert first is not None
    ok(client.get("/v1/collections", headers=headers))
    assert last_used(db, key_id) == first  # within the minute: no write

    long_ago = datetime.now(UTC) - timedelta(seconds=authn.LAST_USED_EVERY_SECONDS + 5)
    with tenancy.as_system(), db.write() as session:
        session.execute(update(ApiKey).where(ApiKey.id == key_id).values(last_used_at=long_ago))
    ok(client.get("/v1/collections", headers=headers))
    refreshed = last_used(db, key_id)
    assert refreshed is not None and refreshed > first
