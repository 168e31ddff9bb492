"""Signed tokens for tests: a gateway's key pairs made in-process, its JWKS (a file, or served on
127.0.0.1), and tokens signed with them, forged ones included.

    keys = TokenKeys.generate(tmp_path)          # an RSA and an EC P-256 key, jwks.json written
    security = keys.settings()                   # SecuritySettings verifying with that file
    token = keys.sign(tenant="acme", groups=["eng"], role="writer")
    forged = keys.unsigned()                     # `alg: none`
    confused = keys.hs256_with_public_pem()      # HS256 keyed with the RSA public key's PEM
    with JwksServer(keys.jwks) as server: ...    # server.url, server.hits

Making an RSA key takes a moment: generate once per module (a module-scoped fixture).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from ragservice.config import SecuritySettings

ISSUER = "https://gateway.example.test"
AUDIENCE = "ragservice"
RSA_KID = "rsa-1"
RSA_PSS_KID = "rsa-pss-1"
"""The RSA key again, its JWK declaring `alg: PS256` (a key without `alg` verifies RS256 only)."""
EC_KID = "ec-1"
_ALG_KID = {"RS256": RSA_KID, "PS256": RSA_PSS_KID, "ES256": EC_KID}


@dataclass(frozen=True)
class TokenKeys:
    """An RSA-2048 and an EC P-256 key pair, and the JWKS of their public halves."""

    rsa: rsa.RSAPrivateKey
    ec: ec.EllipticCurvePrivateKey
    jwks_path: Path
    jwks: dict[str, Any] = field(repr=False)

    @classmethod
    def generate(cls, directory: Path) -> TokenKeys:
        """New key pairs, their JWKS written to `directory/jwks.json`."""
        rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        ec_key = ec.generate_private_key(ec.SECP256R1())
        jwks = {
            "keys": [
                _jwk(RSAAlgorithm.to_jwk(rsa_key.public_key(), as_dict=True), RSA_KID),
                _jwk(RSAAlgorithm.to_jwk(rsa_key.public_key(), as_dict=True), RSA_PSS_KID)
                | {"alg": "PS256"},
                _jwk(ECAlgorithm.to_jwk(ec_key.public_key(), as_dict=True), EC_KID),
            ]
        }
        path = directory / "jwks.json"
        path.write_text(json.dumps(jwks))
        return cls(rsa=rsa_key, ec=ec_key, jwks_path=path, jwks=jwks)

    def settings(self, **overrides: Any) -> SecuritySettings:
        """Security settings verifying tokens with this JWKS file, `ISSUER` and `AUDIENCE`."""
        values: dict[str, Any] = {
            "jwt_jwks": str(self.jwks_path),
            "jwt_issuer": ISSUER,
            "jwt_audience": AUDIENCE,
        }
        return SecuritySettings(**(values | overrides))

    def claims(self, **overrides: Any) -> dict[str, Any]:
        """Valid claims for five minutes (user `alice` of tenant `default`); an override of
        None leaves that claim out."""
        now = int(time.time())
        values: dict[str, Any] = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": "alice",
            "tenant": "default",
            "iat": now,
            "exp": now + 300,
        }
        values.update(overrides)
        return {name: value for name, value in values.items() if value is not None}

    def sign(
        self,
        *,
        alg: str = "RS256",
        kid: str | None = None,
        headers: Mapping[str, Any] | None = None,
        **claims: Any,
    ) -> str:
        """A token signed with the key `alg` needs (RSA for RS*/PS*, EC for ES256), its `kid`
        that key's unless given (a header of None is left out); `claims` override `claims()`'s."""
        key = self.ec if alg.startswith("ES") else self.rsa
        header = {"kid": kid or _ALG_KID.get(alg, RSA_KID), **(headers or {})}
        header = {name: value for name, value in header.items() if value is not None}
        return jwt.encode(self.claims(**claims), key, algorithm=alg, headers=header)

    def unsigned(self, *, kid: str = RSA_KID, **claims: Any) -> str:
        """A forged token with `alg: none` and no signature."""
        return _compact({"alg": "none", "typ": "JWT", "kid": kid}, self.claims(**claims), b"")

    def hs256_with_public_pem(self, *, kid: str = RSA_KID, **claims: Any) -> str:
        """A forged token: HS256, its secret the RSA public key's PEM (which any verifier that
        lets the header pick the algorithm would accept)."""
        pem = self.rsa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        header = {"alg": "HS256", "typ": "JWT", "kid": kid}

        def signature(signing_input: bytes) -> bytes:
            return hmac.new(pem, signing_input, hashlib.sha256).digest()

        return _compact(header, self.claims(**claims), signature)


def _jwk(public: dict[str, Any], kid: str) -> dict[str, Any]:
    return public | {"kid": kid, "use": "sig"}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _compact(header: dict[str, Any], claims: dict[str, Any], signature: Any) -> str:
    """`header.claims.signature`; `signature` is bytes, or a function of the signing input."""
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    signed = signature(signing_input.encode()) if callable(signature) else signature
    return f"{signing_input}.{_b64(signed)}"


class JwksServer:
    """Serves a JWKS at `url` on 127.0.0.1 (no network); `hits` counts the fetches. Set
    `status` to answer with an error instead."""

    def __init__(self, jwks: Mapping[str, Any]) -> None:
        self.jwks = dict(jwks)
        self.hits = 0
        self.status = 200
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/.well-known/jwks.json"

    def __enter__(self) -> JwksServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.hits += 1
                body = json.dumps(owner.jwks).encode()
                self.send_response(owner.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: pytest shows stderr on failures

        return Handler
