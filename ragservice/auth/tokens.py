"""Signed tokens (OIDC/JWT) from a trusted gateway: verified against the gateway's public keys
(a JWKS file or URL) into the identity they carry. Pure verification: the API's authentication
calls `TokenVerifier.verify` and resolves the tenant and the user itself.

A token is refused with `AuthenticationError` and a short reason that is safe to show ("token
expired", "wrong issuer", "unknown key id", …). Neither the reason nor a log line ever holds the
token or any part of it (not even its `kid`), and the library's own error, which may quote the
token's contents, is not chained to it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import jwt
from jwt import PyJWK, PyJWKClient, PyJWKSet

from ragservice.auth.keys import KEY_PREFIX, Role
from ragservice.config import DEFAULT_TENANT_NAME, SecuritySettings, is_loopback
from ragservice.errors import AuthenticationError, ConfigurationError

log = logging.getLogger(__name__)

JWKS_TIMEOUT_SECONDS = 5.0
"""How long one fetch of a JWKS URL may take; a token arriving meanwhile waits that long."""
JWKS_LIFESPAN_SECONDS = 300.0
"""How long a fetched JWKS is used before it is fetched again (an unknown `kid` refetches
sooner, at most once every 30 seconds: PyJWKClient's cooldown)."""
MAX_TOKEN_CHARS = 16_384
"""A longer credential is refused unparsed: real tokens are a few kilobytes at most."""

# Three base64url segments; the third (the signature) is empty in an unsigned `alg: none`
# token, which should still reach the verifier to be refused as such.
_JWT_SHAPE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")

# The library's errors, most specific first (subclasses before their bases), to the reason.
# The times (`exp`, `nbf`, `iat`) are checked here, not by the library, which takes a string
# of digits for a number.
_REASONS: tuple[tuple[type[jwt.PyJWTError], str], ...] = (
    (jwt.InvalidIssuerError, "wrong issuer"),
    (jwt.InvalidAudienceError, "wrong audience"),
    (jwt.exceptions.InvalidSubjectError, "invalid claim: sub"),
    (jwt.exceptions.InvalidJTIError, "invalid claim: jti"),
    (jwt.InvalidSignatureError, "bad signature"),
    (jwt.InvalidAlgorithmError, "algorithm not allowed"),
    (jwt.InvalidKeyError, "signing key refused"),
    (jwt.DecodeError, "malformed token"),
)


@dataclass(frozen=True, slots=True)
class TokenIdentity:
    """Who a verified token says is calling. `tenant` is the tenant's name."""

    tenant: str
    user: str
    groups: frozenset[str]
    role: Role


@dataclass(frozen=True, slots=True)
class _ClaimNames:
    """Which claim holds what (`RAGSERVICE_JWT_*_CLAIM`)."""

    tenant: str
    user: str
    groups: str
    role: str


class _KeySet(Protocol):
    """Where the public keys come from: `key` finds one by its id or raises AuthenticationError."""

    def key(self, kid: str) -> PyJWK: ...


def looks_like_jwt(credential: str) -> bool:
    """Whether a bearer credential is a JWT (three base64url segments) rather than an API key
    (`rsk_…`, which never is one)."""
    return not credential.startswith(KEY_PREFIX) and _JWT_SHAPE.fullmatch(credential) is not None


class TokenVerifier:
    """Checks a token's signature (by the key its `kid` names, with an allowed algorithm that
    is the key's own), its issuer, audience and times, and reads its identity claims."""

    def __init__(self, keys: _KeySet, security: SecuritySettings) -> None:
        if not (security.jwt_issuer and security.jwt_audience):
            raise ConfigurationError("signed tokens need an issuer and an audience")
        self._keys = keys
        self._issuer = security.jwt_issuer
        self._audience = security.jwt_audience
        self._algorithms = frozenset(security.jwt_algorithm_names())
        self._leeway = security.jwt_leeway_seconds
        self._key_tenants = security.jwt_key_tenant_names()
        self._admin = security.jwt_admin
        self._claim_names = _ClaimNames(
            tenant=security.jwt_tenant_claim,
            user=security.jwt_user_claim,
            groups=security.jwt_groups_claim,
            role=security.jwt_role_claim,
        )

    @classmethod
    def from_settings(cls, security: SecuritySettings) -> TokenVerifier | None:
        """The verifier `RAGSERVICE_JWT_*` configure, or None when no JWKS is (tokens off).
        A JWKS file is read now: one that cannot be is a ConfigurationError at start."""
        source = security.jwt_jwks
        if source is None:
            return None
        keys: _KeySet = UrlKeys(source) if is_url(source) else FileKeys(Path(source))
        return cls(keys, security)

    def verify(self, token: str) -> TokenIdentity:
        """The identity a valid token carries, or AuthenticationError with the reason."""
        try:
            return self._verify(token)
        except AuthenticationError as refused:
            log.debug("signed token refused: %s", refused)
            raise

    def _verify(self, token: str) -> TokenIdentity:
        if len(token) > MAX_TOKEN_CHARS or not looks_like_jwt(token):
            raise AuthenticationError("malformed token")
        header = _header(token)
        algorithm = header.get("alg")
        if not isinstance(algorithm, str) or algorithm not in self._algorithms:
            raise AuthenticationError("algorithm not allowed")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise AuthenticationError("missing key id")
        key = self._keys.key(kid)
        if key.algorithm_name != algorithm:
            raise AuthenticationError("algorithm does not match the key")
        claims = self._decode(token, key)
        _check_times(claims, self._leeway)
        identity = self._identity(claims)
        self._check_trust(kid, identity)
        return identity

    def _check_trust(self, kid: str, identity: TokenIdentity) -> None:
        """The key may sign for the tenant (`RAGSERVICE_JWT_KEY_TENANTS`), and the token may
        carry `admin` for it (`RAGSERVICE_JWT_ADMIN`). The reasons name neither."""
        if self._key_tenants is not None:
            allowed = self._key_tenants.get(kid, frozenset())
            if allowed is not None and identity.tenant not in allowed:
                raise AuthenticationError("key not allowed for this tenant")
        if identity.role is Role.ADMIN and (
            self._admin == "none"
            or (self._admin == "tenants" and identity.tenant == DEFAULT_TENANT_NAME)
        ):
            raise AuthenticationError("role not allowed: admin")

    def _decode(self, token: str, key: PyJWK) -> dict[str, Any]:
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[key.algorithm_name],
                audience=self._audience,
                issuer=self._issuer,
                options={
                    "require": ["exp", "iss", "aud"],
                    "enforce_minimum_key_length": True,
                    # `_check_times`: the library would read "9999999999" as a number
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                },
            )
        except jwt.MissingRequiredClaimError as missing:
            # The claim's name is one of ours (`require` above), never the token's text.
            raise AuthenticationError(f"missing claim: {missing.claim}") from None
        except jwt.PyJWTError as error:
            raise AuthenticationError(_reason(error)) from None
        return claims

    def _identity(self, claims: dict[str, Any]) -> TokenIdentity:
        names = self._claim_names
        return TokenIdentity(
            tenant=_text_claim(claims, names.tenant),
            user=_text_claim(claims, names.user),
            groups=_groups_claim(claims, names.groups),
            role=_role_claim(claims, names.role),
        )


def _header(token: str) -> dict[str, Any]:
    try:
        return jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise AuthenticationError("malformed token") from None


def _check_times(claims: dict[str, Any], leeway: float) -> None:
    """`exp` (required: `_decode`) not past, `nbf` and `iat` (when present) not in the future,
    with `leeway` of skew; each a JSON number (RFC 7519's NumericDate), never a string."""
    for name in ("exp", "nbf", "iat"):
        value = claims.get(name, 0)
        if type(value) not in (int, float) or not math.isfinite(value):
            raise AuthenticationError(f"invalid claim: {name}")
    now = time.time()
    if claims["exp"] <= now - leeway:
        raise AuthenticationError("token expired")
    if max(claims.get("nbf", 0), claims.get("iat", 0)) > now + leeway:
        raise AuthenticationError("token not yet valid")


def _reason(error: jwt.PyJWTError) -> str:
    for kind, reason in _REASONS:
        if isinstance(error, kind):
            return reason
    return "invalid token"


def _text_claim(claims: dict[str, Any], name: str) -> str:
    value = claims.get(name)
    if value is None:
        raise AuthenticationError(f"missing claim: {name}")
    if not isinstance(value, str) or not value.strip():
        raise AuthenticationError(f"invalid claim: {name}")
    return value


def _groups_claim(claims: dict[str, Any], name: str) -> frozenset[str]:
    value = claims.get(name)
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(g, str) and g for g in value):
        raise AuthenticationError(f"invalid claim: {name}")
    return frozenset(value)


def _role_claim(claims: dict[str, Any], name: str) -> Role:
    value = claims.get(name)
    if value is None:
        return Role.READER
    roles = {role.value: role for role in Role}
    if not isinstance(value, str) or value.lower() not in roles:
        raise AuthenticationError(f"invalid claim: {name}")
    return roles[value.lower()]


# -- where the keys come from ------------------------------------------------------------------


def is_url(source: str) -> bool:
    """Whether `RAGSERVICE_JWT_JWKS` names a URL (`http://`, `https://`) rather than a file."""
    return source.lower().startswith(("https://", "http://"))


class FileKeys:
    """A JWKS file's signing keys by id, read at start and again whenever the file changes (a
    rotation needs no restart; a changed file that cannot be read keeps the keys before it)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        # One tuple, replaced whole: a reader in another thread sees a stamp with its keys.
        self._loaded = self._load()

    def key(self, kid: str) -> PyJWK:
        self._reload_if_changed()
        found = self._loaded[1].get(kid)
        if found is None:
            raise AuthenticationError("unknown key id")
        return found

    def _reload_if_changed(self) -> None:
        try:
            if _stamp(self._path) == self._loaded[0]:
                return
            self._loaded = self._load()
        except (OSError, ConfigurationError) as error:
            log.warning("JWKS file %s not reloaded, its last keys kept: %s", self._path, error)

    def _load(self) -> tuple[tuple[float, int], dict[str, PyJWK]]:
        try:
            stamp = _stamp(self._path)
            document = json.loads(self._path.read_text(encoding="utf-8"))
            keys = PyJWKSet.from_dict(document) if isinstance(document, dict) else None
        except (OSError, ValueError, jwt.PyJWTError) as error:
            raise ConfigurationError(f"JWKS file {self._path}: {error}") from error
        if keys is None:
            raise ConfigurationError(f"JWKS file {self._path}: not a JSON object")
        signing = _signing_keys(keys)
        if not signing:
            raise ConfigurationError(f"JWKS file {self._path}: no signing key with a `kid`")
        return stamp, signing


def _stamp(path: Path) -> tuple[float, int]:
    found = os.stat(path)
    return found.st_mtime, found.st_size


def _signing_keys(keys: PyJWKSet) -> dict[str, PyJWK]:
    """The keys meant for signatures (`use` absent or `sig`) that have an id, by id."""
    return {key.key_id: key for key in keys if key.key_id and key.public_key_use in (None, "sig")}


class UrlKeys:
    """A JWKS URL's signing keys through PyJWKClient: fetched on first use, cached, fetched
    again when stale or when a token names an unknown key (rotation). A failed fetch refuses
    the token ("signing keys unavailable", 401), never a 500."""

    def __init__(self, url: str) -> None:
        if url.lower().startswith("http://") and not is_loopback(_host(url)):
            log.warning("JWKS fetched over plain http from %s: use https", _host(url))
        self._client = PyJWKClient(
            url, lifespan=JWKS_LIFESPAN_SECONDS, timeout=JWKS_TIMEOUT_SECONDS
        )

    def key(self, kid: str) -> PyJWK:
        self._fetch()
        try:
            return self._client.get_signing_key(kid)
        except (jwt.PyJWKClientConnectionError, jwt.PyJWKSetError, ValueError) as error:
            raise self._unavailable(error) from None
        except jwt.PyJWKClientError:
            raise AuthenticationError("unknown key id") from None

    def _fetch(self) -> None:
        """The key set, from the cache or the URL (errors out of PyJWKClient or its JSON)."""
        try:
            self._client.get_signing_keys()
        except (jwt.PyJWTError, ValueError) as error:
            raise self._unavailable(error) from None

    def _unavailable(self, error: Exception) -> AuthenticationError:
        log.warning("JWKS from %s unavailable: %s", _host(self._client.uri), error)
        return AuthenticationError("signing keys unavailable")


def _host(url: str) -> str:
    """The URL's host alone: what a log line may name (the URL may hold credentials)."""
    return urlsplit(url).hostname or ""
