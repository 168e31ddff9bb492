"""Signed tokens from a trusted gateway through the API: a valid token reads what its user and
groups may read; expired, wrong issuer, wrong audience, unknown key id, `alg: none` and HS/RS
confusion are refused with 401 and a reason that never holds the token."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ragservice import store
from ragservice.api.app import create_app
from ragservice.config import Settings
from ragservice.db import tenancy
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from tests.api.conftest import make_key, ok, wait_for_job
from tests.jwt_keys import AUDIENCE, ISSUER, TokenKeys


@pytest.fixture(scope="module")
def token_keys(tmp_path_factory: pytest.TempPathFactory) -> TokenKeys:
    return TokenKeys.generate(tmp_path_factory.mktemp("jwks"))


@pytest.fixture
def gateway(
    settings: Settings, embedder: SentenceTransformerEmbedder, token_keys: TokenKeys
) -> Iterator[TestClient]:
    from ingest.worker import JobWorker

    configured = settings.model_copy(
        update={
            "job_poll_seconds": 0.2,
            "workers": 1,
            "jwt_jwks": str(token_keys.jwks_path),
            "jwt_issuer": ISSUER,
            "jwt_audience": AUDIENCE,
            "jwt_groups_from": "both",
            "auth_failures_per_minute": 0,
        }
    )
    app = create_app(configured, embedder=embedder, services=[JobWorker])
    with TestClient(app, raise_server_exceptions=False) as client:
        db = client.app.state.runtime.db  # type: ignore[attr-defined]
        with tenancy.as_system(), db.write() as session:
            tenant_id = store.tenants.ensure_tenant(session, "acme")
            store.tenants.add_group_members(session, tenant_id, "legal", ["carol"])
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def corpus(gateway: TestClient, token_keys: TokenKeys) -> None:
    admin = bearer(token_keys.sign(sub="root", tenant="acme", role="admin"))
    ok(gateway.post("/v1/collections", json={"name": "docs"}, headers=admin), 201)
    documents = [
        {
            "external_id": "hr-plan",
            "text": "The hiring plan adds four engineers.",
            "readers": ["group:hr"],
        },
        {
            "external_id": "contract",
            "text": "The hiring contract is signed.",
            "readers": ["group:legal"],
        },
        {"external_id": "open", "text": "The hiring page lists open roles."},
    ]
    job = ok(
        gateway.post(
            "/v1/collections/docs/documents", json={"documents": documents}, headers=admin
        ),
        202,
    )
    assert wait_for_job(gateway, job["id"], admin)["status"] == "done"


def found(client: TestClient, headers: dict[str, str]) -> set[str]:
    body = {"query": "hiring", "collections": ["docs"], "k": 10}
    hits = ok(client.post("/v1/search", json=body, headers=headers))["results"]
    return {hit["document"]["external_id"] for hit in hits}


def test_a_token_reads_what_its_user_and_groups_may_read(
    gateway: TestClient, token_keys: TokenKeys, corpus: None
) -> None:
    hr = bearer(token_keys.sign(sub="ana", tenant="acme", groups=["hr"]))
    assert found(gateway, hr) == {"hr-plan", "open"}
    # carol's group comes from the store (jwt_groups_from=both), an ES256 token this time.
    carol = bearer(token_keys.sign(alg="ES256", sub="carol", tenant="acme"))
    assert found(gateway, carol) == {"contract", "open"}
    nobody = bearer(token_keys.sign(sub="dave", tenant="acme", groups=[]))
    assert found(gateway, nobody) == {"open"}
    me = ok(gateway.get("/v1/me", headers=hr))
    assert (me["role"], me["user"], me["readers"]) == ("reader", "ana", ["group:hr", "user:ana"])
    # a reader token may not write
    refused = gateway.post("/v1/collections", json={"name": "x"}, headers=hr)
    assert refused.status_code == 403


def _refusals(keys: TokenKeys) -> dict[str, tuple[str, str]]:
    now = int(time.time())
    return {
        "expired": (keys.sign(tenant="acme", exp=now - 120, iat=now - 600), "token expired"),
        "wrong issuer": (keys.sign(tenant="acme", iss="https://evil.test"), "wrong issuer"),
        "wrong audience": (keys.sign(tenant="acme", aud="someone-else"), "wrong audience"),
        "unknown kid": (keys.sign(tenant="acme", kid="rotated-away"), "unknown key id"),
        "alg none": (keys.unsigned(tenant="acme"), "algorithm not allowed"),
        "hs/rs confusion": (keys.hs256_with_public_pem(tenant="acme"), "algorithm not allowed"),
        "unknown tenant": (keys.sign(tenant="nowhere"), "invalid claim: tenant"),
        "bad group name": (keys.sign(tenant="acme", groups=["HR Team"]), "invalid claim"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "expired",
        "wrong issuer",
        "wrong audience",
        "unknown kid",
        "alg none",
        "hs/rs confusion",
        "unknown tenant",
        "bad group name",
    ],
)
def test_bad_tokens_are_refused_with_a_reason_and_never_echoed(
    gateway: TestClient,
    token_keys: TokenKeys,
    case: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    token, reason = _refusals(token_keys)[case]
    with caplog.at_level(logging.DEBUG):
        refused = gateway.post("/v1/search", json={"query": "hiring"}, headers=bearer(token))
    assert refused.status_code == 401, refused.text
    body: dict[str, Any] = refused.json()
    assert reason in body["detail"], body
    assert refused.headers["www-authenticate"] == "Bearer"
    for part in (token, *token.split(".")):
        if part:
            assert part not in refused.text
            assert part not in caplog.text
    metrics = gateway.get("/metrics").text
    assert 'ragservice_auth_refused_requests_total{reason="token"}' in metrics


def test_api_keys_still_work_beside_tokens(gateway: TestClient) -> None:
    db = gateway.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.write() as session:
        secret = make_key(session, store.tenants.ensure_tenant(session, "acme"), "reader")
    assert ok(gateway.get("/v1/me", headers=bearer(secret)))["role"] == "reader"
