"""Signed tokens (ragservice.auth.tokens): good tokens give their identity; expired, misdirected,
forged and malformed ones are refused with a specific reason that never quotes the token; the
keys come from a JWKS file or URL; the settings refuse what cannot be safe."""

from __future__ import annotations

import json
import logging
import socket
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from jwt.warnings import InsecureKeyLengthWarning
from pydantic import ValidationError

from ragservice.auth.keys import Role
from ragservice.auth.tokens import TokenIdentity, TokenVerifier, looks_like_jwt
from ragservice.config import SecuritySettings, Settings
from ragservice.errors import AuthenticationError, ConfigurationError
from tests.jwt_keys import AUDIENCE, EC_KID, RSA_KID, RSA_PSS_KID, JwksServer, TokenKeys


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> TokenKeys:
    return TokenKeys.generate(tmp_path_factory.mktemp("jwks"))


@pytest.fixture(scope="module")
def verifier(keys: TokenKeys) -> TokenVerifier:
    return verifier_of(keys.settings())


def verifier_of(security: SecuritySettings) -> TokenVerifier:
    made = TokenVerifier.from_settings(security)
    assert made is not None
    return made


def refusal(verifier: TokenVerifier, token: str) -> str:
    with pytest.raises(AuthenticationError) as refused:
        verifier.verify(token)
    return str(refused.value)


def test_rs256_and_es256_tokens_give_their_identity(
    keys: TokenKeys, verifier: TokenVerifier
) -> None:
    rs = verifier.verify(keys.sign(alg="RS256", sub="alice", tenant="acme", groups=["eng", "hr"]))
    es = verifier.verify(keys.sign(alg="ES256", sub="bob", tenant="globex", role="writer"))
    assert rs == TokenIdentity(
        tenant="acme", user="alice", groups=frozenset({"eng", "hr"}), role=Role.READER
    )
    assert es == TokenIdentity(tenant="globex", user="bob", groups=frozenset(), role=Role.WRITER)


def test_an_audience_list_that_names_the_service_is_accepted(
    keys: TokenKeys, verifier: TokenVerifier
) -> None:
    assert verifier.verify(keys.sign(aud=["other", AUDIENCE])).user == "alice"


def test_claim_names_are_configurable(keys: TokenKeys) -> None:
    verifier = verifier_of(
        keys.settings(
            jwt_user_claim="email",
            jwt_groups_claim="teams",
            jwt_tenant_claim="org",
            jwt_role_claim="ragservice_role",
        )
    )
    token = keys.sign(
        sub="ignored",
        tenant=None,
        email="carol@example.test",
        org="initech",
        teams=["ops"],
        groups=["ignored"],
        ragservice_role="Admin",
        role="reader",
    )
    assert verifier.verify(token) == TokenIdentity(
        tenant="initech", user="carol@example.test", groups=frozenset({"ops"}), role=Role.ADMIN
    )


REFUSALS: dict[str, tuple[Callable[[TokenKeys], str], str]] = {
    "expired": (lambda k: k.sign(exp=int(time.time()) - 120), "token expired"),
    "not yet valid": (lambda k: k.sign(nbf=int(time.time()) + 600), "token not yet valid"),
    "issued in the future": (lambda k: k.sign(iat=int(time.time()) + 600), "token not yet valid"),
    "wrong issuer": (lambda k: k.sign(iss="https://evil.example.test"), "wrong issuer"),
    "wrong audience": (lambda k: k.sign(aud="someone-else"), "wrong audience"),
    "no expiry": (lambda k: k.sign(exp=None), "missing claim: exp"),
    "no issuer": (lambda k: k.sign(iss=None), "missing claim: iss"),
    "no audience": (lambda k: k.sign(aud=None), "missing claim: aud"),
    "unknown kid": (lambda k: k.sign(kid="retired-key"), "unknown key id"),
    "no kid": (lambda k: k.sign(headers={"kid": None}), "missing key id"),
    "alg none": (lambda k: k.unsigned(), "algorithm not allowed"),
    "HS256 keyed with the public PEM": (
        lambda k: k.hs256_with_public_pem(),
        "algorithm not allowed",
    ),
    "alg outside the allow-list": (lambda k: k.sign(alg="RS384"), "algorithm not allowed"),
    "RS256 by the EC key's id": (
        lambda k: k.sign(alg="RS256", kid=EC_KID),
        "algorithm does not match the key",
    ),
    "bad signature": (lambda k: tampered(k.sign(), k.sign(tenant="other")), "bad signature"),
    "malformed": (lambda k: "eyJub3QiOiJqc29u.eyJ9.c2ln", "malformed token"),
    "not three segments": (lambda k: "a.b", "malformed token"),
    "an API key": (lambda k: "rsk_abcdefghijklmnop", "malformed token"),
    "no tenant": (lambda k: k.sign(tenant=None), "missing claim: tenant"),
    "no user": (lambda k: k.sign(sub=None), "missing claim: sub"),
    "user not a string": (lambda k: k.sign(sub=["alice"]), "invalid claim: sub"),
    "tenant not a string": (lambda k: k.sign(tenant=42), "invalid claim: tenant"),
    "groups not a list": (lambda k: k.sign(groups="eng"), "invalid claim: groups"),
    "a group not a string": (lambda k: k.sign(groups=["eng", 7]), "invalid claim: groups"),
    "unknown role": (lambda k: k.sign(role="owner"), "invalid claim: role"),
}


def tampered(token: str, other: str) -> str:
    """`token`'s header and signature around `other`'s claims."""
    header, _, signature = token.split(".")
    return f"{header}.{other.split('.')[1]}.{signature}"


@pytest.mark.parametrize("case", REFUSALS)
def test_bad_tokens_are_refused_with_their_reason(
    keys: TokenKeys, verifier: TokenVerifier, case: str
) -> None:
    make, reason = REFUSALS[case]
    assert refusal(verifier, make(keys)) == reason


def test_refusals_never_show_the_token_in_the_error_or_the_logs(
    keys: TokenKeys, verifier: TokenVerifier, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for case, (make, _) in REFUSALS.items():
        token = make(keys)
        with pytest.raises(AuthenticationError) as refused:
            verifier.verify(token)
        shown = "".join(traceback.format_exception(refused.value)) + caplog.text
        # Nothing of the library's chained: its messages may quote the token's contents.
        error = refused.value
        assert error.__cause__ is None, case
        assert error.__context__ is None or error.__suppress_context__, case
        assert token not in shown, case
        for part in token.split("."):
            assert len(part) < 8 or part not in shown, case
    assert "signed token refused: token expired" in caplog.text  # the reason is logged


def test_refusals_by_a_jwks_url_never_show_the_key_id(
    keys: TokenKeys, caplog: pytest.LogCaptureFixture
) -> None:
    """PyJWKClient's own error quotes the unknown `kid`: none of it may show."""
    caplog.set_level(logging.DEBUG)
    unknown, other = uuid.uuid4().hex, uuid.uuid4().hex  # not in this source, which tracebacks show
    with JwksServer(keys.jwks) as server:
        verifier = verifier_of(keys.settings(jwt_jwks=server.url))
        with pytest.raises(AuthenticationError) as refused:
            verifier.verify(keys.sign(kid=unknown))
        server.status = 503
        with pytest.raises(AuthenticationError):
            verifier_of(keys.settings(jwt_jwks=server.url)).verify(keys.sign(kid=other))
    shown = "".join(traceback.format_exception(refused.value)) + caplog.text
    assert unknown not in shown and other not in shown
    assert "unknown key id" in shown and "unavailable" in shown


def test_ps256_needs_a_key_that_declares_it(keys: TokenKeys) -> None:
    """A JWK's `alg` binds it to that algorithm; one without verifies its type's usual one
    (RSA: RS256), so an RSA key without `alg` does not verify PS256."""
    verifier = verifier_of(keys.settings(jwt_algorithms="RS256,PS256"))
    assert verifier.verify(keys.sign(alg="PS256", kid=RSA_PSS_KID)).user == "alice"
    assert refusal(verifier, keys.sign(alg="PS256", kid=RSA_KID)) == (
        "algorithm does not match the key"
    )
    assert refusal(verifier, keys.sign(alg="RS256", kid=RSA_PSS_KID)) == (
        "algorithm does not match the key"
    )


def test_a_weak_rsa_key_is_refused(keys: TokenKeys, tmp_path: Path) -> None:
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    jwk = RSAAlgorithm.to_jwk(weak.public_key(), as_dict=True) | {"kid": "weak"}
    path = tmp_path / "weak.json"
    path.write_text(json.dumps({"keys": [jwk]}))
    with pytest.warns(InsecureKeyLengthWarning):  # signing warns; verifying refuses
        token = jwt.encode(keys.claims(), weak, algorithm="RS256", headers={"kid": "weak"})
    assert refusal(verifier_of(keys.settings(jwt_jwks=str(path))), token) == "signing key refused"


def test_an_allowed_algorithm_list_refuses_the_others(keys: TokenKeys) -> None:
    verifier = verifier_of(keys.settings(jwt_algorithms=["ES256"]))
    assert verifier.verify(keys.sign(alg="ES256")).user == "alice"
    assert refusal(verifier, keys.sign(alg="RS256")) == "algorithm not allowed"


def test_leeway_allows_that_much_clock_skew(keys: TokenKeys) -> None:
    token = keys.sign(exp=int(time.time()) - 10)
    assert verifier_of(keys.settings(jwt_leeway_seconds=30)).verify(token).user == "alice"
    assert refusal(verifier_of(keys.settings(jwt_leeway_seconds=0)), token) == "token expired"


def test_a_rewritten_jwks_file_is_read_again(keys: TokenKeys, tmp_path: Path) -> None:
    path = tmp_path / "jwks.json"
    path.write_text(keys.jwks_path.read_text())
    verifier = verifier_of(keys.settings(jwt_jwks=str(path)))
    token = keys.sign(alg="ES256")
    assert verifier.verify(token).user == "alice"
    path.write_text(json.dumps({"keys": [keys.jwks["keys"][0]]}))  # the EC key retired
    assert refusal(verifier, token) == "unknown key id"
    path.write_text("not json")  # a broken rewrite keeps the keys before it
    assert verifier.verify(keys.sign(alg="RS256")).user == "alice"


def test_tokens_are_off_without_a_jwks_and_a_bad_file_stops_the_start(
    keys: TokenKeys, tmp_path: Path
) -> None:
    assert TokenVerifier.from_settings(SecuritySettings()) is None
    assert TokenVerifier.from_settings(SecuritySettings(jwt_jwks="  ")) is None
    with pytest.raises(ConfigurationError, match="JWKS file"):
        TokenVerifier.from_settings(keys.settings(jwt_jwks=str(tmp_path / "missing.json")))
    (tmp_path / "empty.json").write_text('{"keys": []}')
    with pytest.raises(ConfigurationError, match="JWKS file"):
        TokenVerifier.from_settings(keys.settings(jwt_jwks=str(tmp_path / "empty.json")))
    no_kid = {name: value for name, value in keys.jwks["keys"][0].items() if name != "kid"}
    (tmp_path / "no-kid.json").write_text(json.dumps({"keys": [no_kid]}))
    with pytest.raises(ConfigurationError, match="no signing key with a `kid`"):
        TokenVerifier.from_settings(keys.settings(jwt_jwks=str(tmp_path / "no-kid.json")))


def test_keys_by_url_are_fetched_once_and_cached(keys: TokenKeys) -> None:
    with JwksServer(keys.jwks) as server:
        verifier = verifier_of(keys.settings(jwt_jwks=server.url))
        assert verifier.verify(keys.sign(alg="RS256")).user == "alice"
        assert verifier.verify(keys.sign(alg="ES256")).user == "alice"
        assert refusal(verifier, keys.sign(kid="retired-key")) == "unknown key id"
        assert server.hits == 1  # an unknown kid refetches at most every 30 s


def test_a_jwks_url_that_fails_refuses_the_token(
    keys: TokenKeys, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    unreachable = verifier_of(keys.settings(jwt_jwks=f"http://127.0.0.1:{port}/jwks.json"))
    assert refusal(unreachable, keys.sign()) == "signing keys unavailable"
    with JwksServer(keys.jwks) as server:
        server.status = 500
        failing = verifier_of(keys.settings(jwt_jwks=server.url))
        assert refusal(failing, keys.sign()) == "signing keys unavailable"
    with JwksServer({"keys": "not a list"}) as server:
        garbled = verifier_of(keys.settings(jwt_jwks=server.url))
        assert refusal(garbled, keys.sign()) == "signing keys unavailable"
    assert "JWKS from 127.0.0.1 unavailable" in caplog.text


def test_looks_like_jwt_tells_tokens_from_api_keys(keys: TokenKeys) -> None:
    assert looks_like_jwt(keys.sign())
    assert looks_like_jwt(keys.unsigned())  # so it is refused as `alg: none`
    assert not looks_like_jwt("rsk_" + keys.sign())
    assert not looks_like_jwt("rsk_3q2Vabc.def.ghi")
    assert not looks_like_jwt("a.b")
    assert not looks_like_jwt("a.b.c.d")
    assert not looks_like_jwt("a b.c.d")


@pytest.mark.parametrize("algorithms", ["RS256,HS256", "none", "HS512", ["RS256", "none"], " , "])
def test_symmetric_and_unsigned_algorithms_cannot_be_configured(algorithms: str) -> None:
    with pytest.raises(ValidationError, match="RAGSERVICE_JWT_ALGORITHMS"):
        SecuritySettings(jwt_algorithms=algorithms)


def test_a_jwks_needs_an_issuer_and_an_audience() -> None:
    for given in (
        {"jwt_audience": "a"},
        {"jwt_issuer": "i"},
        {"jwt_issuer": "i", "jwt_audience": ""},
    ):
        with pytest.raises(ValidationError, match="needs RAGSERVICE_JWT_ISSUER"):
            SecuritySettings(jwt_jwks="/etc/jwks.json", **given)
    with pytest.raises(ValidationError, match="less than or equal to 300"):
        SecuritySettings(jwt_leeway_seconds=301)


def test_the_settings_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSERVICE_JWT_JWKS", "https://idp.example.test/jwks.json")
    monkeypatch.setenv("RAGSERVICE_JWT_ISSUER", "https://idp.example.test")
    monkeypatch.setenv("RAGSERVICE_JWT_AUDIENCE", "ragservice")
    monkeypatch.setenv("RAGSERVICE_JWT_ALGORITHMS", "rs256, ES384")
    monkeypatch.setenv("RAGSERVICE_JWT_GROUPS_FROM", "both")
    security = Settings().security
    assert security.jwt_algorithm_names() == ("RS256", "ES384")
    assert (security.jwt_jwks, security.jwt_groups_from) == (
        "https://idp.example.test/jwks.json",
        "both",
    )
    monkeypatch.delenv("RAGSERVICE_JWT_AUDIENCE")
    with pytest.raises(ValidationError, match="needs RAGSERVICE_JWT_ISSUER"):
        Settings()
