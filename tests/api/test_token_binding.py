"""Signed tokens through the API: a string `exp` and a token claiming the default tenant's
admin are refused with 401 and their reason; a key bound to a tenant signs for it alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from ragservice import store
from ragservice.api.app import create_app
from ragservice.config import DEFAULT_TENANT_NAME, Settings
from ragservice.db import tenancy
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from tests.api.conftest import ok
from tests.jwt_keys import AUDIENCE, EC_KID, ISSUER, TokenKeys


@pytest.fixture(scope="module")
def token_keys(tmp_path_factory: pytest.TempPathFactory) -> TokenKeys:
    return TokenKeys.generate(tmp_path_factory.mktemp("jwks"))


@pytest.fixture
def gateway(
    settings: Settings, embedder: SentenceTransformerEmbedder, token_keys: TokenKeys
) -> Iterator[TestClient]:
    configured = settings.model_copy(
        update={
            "jwt_jwks": str(token_keys.jwks_path),
            "jwt_issuer": ISSUER,
            "jwt_audience": AUDIENCE,
            "jwt_key_tenants": f"{EC_KID}=acme",  # the RSA key: not named, no tenant
            "auth_failures_per_minute": 0,
        }
    )
    app = create_app(configured, embedder=embedder)
    with TestClient(app, raise_server_exceptions=False) as client:
        db = client.app.state.runtime.db  # type: ignore[attr-defined]
        with tenancy.as_system(), db.write() as session:
            store.tenants.ensure_tenant(session, "acme")
            store.tenants.ensure_tenant(session, "globex")
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def refused(client: TestClient, token: str) -> str:
    answer = client.get("/v1/me", headers=bearer(token))
    assert answer.status_code == 401, answer.text
    detail: str = answer.json()["detail"]
    return detail


def test_tokens_are_bound_to_their_keys_tenants_and_admin_roles(
    gateway: TestClient, token_keys: TokenKeys
) -> None:
    acme = token_keys.sign(alg="ES256", tenant="acme", role="admin")
    assert ok(gateway.get("/v1/me", headers=bearer(acme)))["role"] == "admin"
    assert "key not allowed for this tenant" in refused(
        gateway, token_keys.sign(alg="ES256", tenant="globex")
    )
    assert "key not allowed for this tenant" in refused(gateway, token_keys.sign(tenant="acme"))
    assert "invalid claim: exp" in refused(
        gateway, token_keys.sign(alg="ES256", tenant="acme", exp="9999999999")
    )


def test_a_token_is_not_the_default_tenants_admin(
    settings: Settings, embedder: SentenceTransformerEmbedder, token_keys: TokenKeys
) -> None:
    configured = settings.model_copy(
        update={
            "jwt_jwks": str(token_keys.jwks_path),
            "jwt_issuer": ISSUER,
            "jwt_audience": AUDIENCE,
            "auth_failures_per_minute": 0,
        }
    )
    with TestClient(create_app(configured, embedder=embedder)) as client:
        admin = token_keys.sign(tenant=DEFAULT_TENANT_NAME, role="admin")
        assert "role not allowed: admin" in refused(client, admin)
        writer = token_keys.sign(tenant=DEFAULT_TENANT_NAME, role="writer")
        assert ok(client.get("/v1/me", headers=bearer(writer)))["role"] == "writer"
