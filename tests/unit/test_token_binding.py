"""Signed tokens: the times are JSON numbers (a string `exp` is refused, not read as a number),
a key signs only for the tenants `RAGSERVICE_JWT_KEY_TENANTS` binds it to, and a token's `admin`
role is honoured only where `RAGSERVICE_JWT_ADMIN` allows (never for the default tenant unless
told)."""

from __future__ import annotations

import time
from typing import Any

import jwt
import pytest
from pydantic import ValidationError

from ragservice.auth.keys import Role
from ragservice.auth.tokens import TokenVerifier
from ragservice.config import DEFAULT_TENANT_NAME, SecuritySettings, Settings
from tests.jwt_keys import EC_KID, RSA_KID, RSA_PSS_KID, TokenKeys
from tests.unit.test_jwt_tokens import refusal, verifier_of


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> TokenKeys:
    return TokenKeys.generate(tmp_path_factory.mktemp("jwks"))


def verifier_with(keys: TokenKeys, **settings: Any) -> TokenVerifier:
    return verifier_of(keys.settings(**settings))


# -- the times -------------------------------------------------------------------------------


def wrong_times() -> dict[str, tuple[dict[str, Any], str]]:
    now = int(time.time())
    return {
        "string exp far ahead": ({"exp": "9999999999"}, "invalid claim: exp"),
        "string exp now": ({"exp": str(now + 300)}, "invalid claim: exp"),
        "string exp past": ({"exp": "1"}, "invalid claim: exp"),
        "word exp": ({"exp": "tomorrow"}, "invalid claim: exp"),
        "boolean exp": ({"exp": True}, "invalid claim: exp"),
        "list exp": ({"exp": [now + 300]}, "invalid claim: exp"),
        "string nbf": ({"nbf": "0"}, "invalid claim: nbf"),
        "null nbf": ({"nbf": None}, "invalid claim: nbf"),
        "word nbf": ({"nbf": "yesterday"}, "invalid claim: nbf"),
        "string iat": ({"iat": str(now)}, "invalid claim: iat"),
        "object iat": ({"iat": {"at": now}}, "invalid claim: iat"),
    }


@pytest.mark.parametrize("case", list(wrong_times()))
def test_times_that_are_not_numbers_are_refused(keys: TokenKeys, case: str) -> None:
    claims, reason = wrong_times()[case]
    token = jwt.encode(
        keys.claims() | claims, keys.rsa, algorithm="RS256", headers={"kid": RSA_KID}
    )
    assert refusal(verifier_with(keys), token) == reason


def test_numeric_times_still_work(keys: TokenKeys) -> None:
    now = time.time()
    verifier = verifier_with(keys)
    assert verifier.verify(keys.sign(exp=now + 300.5, nbf=now - 1.5, iat=now)).user == "alice"
    assert verifier.verify(keys.sign(iat=None)).user == "alice"
    assert refusal(verifier, keys.sign(exp=int(now) - 120)) == "token expired"
    assert refusal(verifier, keys.sign(exp=float(now) - 120)) == "token expired"
    assert refusal(verifier, keys.sign(nbf=int(now) + 600)) == "token not yet valid"
    assert refusal(verifier, keys.sign(iat=int(now) + 600)) == "token not yet valid"
    assert verifier.verify(keys.sign(exp=int(now) - 10)).user == "alice"  # within the leeway
    assert refusal(verifier, keys.sign(exp=None)) == "missing claim: exp"


def test_a_bad_signature_is_told_before_a_bad_time(keys: TokenKeys) -> None:
    token = keys.sign(exp="9999999999")
    header, claims, signature = token.split(".")
    forged = f"{header}.{claims}.{signature[:-4]}AAAA"
    assert refusal(verifier_with(keys), forged) == "bad signature"


# -- keys bound to tenants ---------------------------------------------------------------------


def test_unbound_keys_sign_for_any_tenant(keys: TokenKeys) -> None:
    verifier = verifier_with(keys)
    for alg in ("RS256", "ES256"):
        assert verifier.verify(keys.sign(alg=alg, tenant="acme")).tenant == "acme"
        assert verifier.verify(keys.sign(alg=alg, tenant="globex")).tenant == "globex"


def test_a_bound_key_signs_only_for_its_tenants(keys: TokenKeys) -> None:
    verifier = verifier_with(
        keys,
        jwt_key_tenants=f"{RSA_KID}=acme|initech, {EC_KID}=*",
        jwt_algorithms="RS256,ES256,PS256",
    )
    assert verifier.verify(keys.sign(tenant="acme")).tenant == "acme"
    assert verifier.verify(keys.sign(tenant="initech")).tenant == "initech"
    assert refusal(verifier, keys.sign(tenant="globex")) == "key not allowed for this tenant"
    assert refusal(verifier, keys.sign(tenant=DEFAULT_TENANT_NAME)) == (
        "key not allowed for this tenant"
    )
    # `*`: every tenant
    assert verifier.verify(keys.sign(alg="ES256", tenant="globex")).tenant == "globex"
    # a key the setting does not name signs for no tenant
    assert refusal(verifier, keys.sign(alg="PS256", tenant="acme")) == (
        "key not allowed for this tenant"
    )


def test_the_refusal_never_names_the_key_or_the_tenant(keys: TokenKeys) -> None:
    verifier = verifier_with(keys, jwt_key_tenants=f"{EC_KID}=acme")
    reason = refusal(verifier, keys.sign(tenant="secret-tenant"))
    assert RSA_KID not in reason and "secret-tenant" not in reason


@pytest.mark.parametrize(
    "value",
    ["rsa-1", "=acme", "rsa-1=", "rsa-1=acme,rsa-1=globex", "rsa-1=acme|", "rsa-1=a b"],
)
def test_a_malformed_binding_stops_the_start(value: str) -> None:
    with pytest.raises(ValidationError, match="RAGSERVICE_JWT_KEY_TENANTS"):
        SecuritySettings(jwt_key_tenants=value)


def test_the_binding_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSERVICE_JWT_KEY_TENANTS", f" {RSA_KID} = acme | globex ,{RSA_PSS_KID}=*")
    monkeypatch.setenv("RAGSERVICE_JWT_ADMIN", "none")
    security = Settings().security
    assert security.jwt_key_tenant_names() == {
        RSA_KID: frozenset({"acme", "globex"}),
        RSA_PSS_KID: None,
    }
    assert security.jwt_admin == "none"
    monkeypatch.setenv("RAGSERVICE_JWT_KEY_TENANTS", "")
    assert Settings().security.jwt_key_tenant_names() is None


# -- the admin role --------------------------------------------------------------------------


def test_by_default_a_token_is_an_admin_of_any_tenant_but_the_default_one(
    keys: TokenKeys,
) -> None:
    verifier = verifier_with(keys)
    assert verifier.verify(keys.sign(tenant="acme", role="admin")).role is Role.ADMIN
    default_admin = keys.sign(tenant=DEFAULT_TENANT_NAME, role="admin")
    assert refusal(verifier, default_admin) == "role not allowed: admin"
    writer = verifier.verify(keys.sign(tenant=DEFAULT_TENANT_NAME, role="writer"))
    assert writer.role is Role.WRITER


def test_admin_all_lets_a_token_be_the_default_tenants_admin(keys: TokenKeys) -> None:
    verifier = verifier_with(keys, jwt_admin="all")
    token = keys.sign(tenant=DEFAULT_TENANT_NAME, role="ADMIN")
    assert verifier.verify(token).role is Role.ADMIN


def test_admin_none_refuses_every_admin_token(keys: TokenKeys) -> None:
    verifier = verifier_with(keys, jwt_admin="none")
    assert refusal(verifier, keys.sign(tenant="acme", role="admin")) == "role not allowed: admin"
    assert verifier.verify(keys.sign(tenant="acme", role="writer")).role is Role.WRITER
