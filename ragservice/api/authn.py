"""Authentication before anything else of a request: the API key is resolved from the headers
before the body is read or parsed, and before any read that a consistency token could make
wait on a replica.

Every path under `/v1/` needs a key, or a signed token from a trusted gateway where
`RAGSERVICE_JWT_JWKS` is set (`auth.tokens`; docs/permissions.md); the health and metrics paths
do not (see `app`). A key or token names the caller's tenant, its role, and the user whose
documents it reads (`Principal.readers`). A client
address that sends too many wrong, revoked or expired keys is refused with 429 for a while,
without a database read (`RAGSERVICE_AUTH_FAILURES_PER_MINUTE`). The address is the socket's
peer as the ASGI server reports it: uvicorn replaces it with the `X-Forwarded-For` client only
for proxies listed in its `FORWARDED_ALLOW_IPS` (default 127.0.0.1).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial

import anyio.to_thread
from psycopg import OperationalError as DriverOperationalError
from sqlalchemy.exc import OperationalError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ragservice import store
from ragservice.api.middleware import REQUEST_ID_HEADER
from ragservice.auth.keys import Role, hash_key
from ragservice.auth.tokens import TokenVerifier, looks_like_jwt
from ragservice.config.serving import GroupsFrom
from ragservice.db import tenancy
from ragservice.db.models import ApiKey
from ragservice.db.scope import current_scope
from ragservice.errors import (
    AuthenticationError,
    DatabaseUnavailableError,
    InvalidInputError,
    RagServiceError,
    RateLimitedError,
)
from ragservice.limits.rate_limits import RateLimiter
from ragservice.metrics import Metrics
from ragservice.observability import logs
from ragservice.readers import principal_set
from ragservice.runtime import Runtime

log = logging.getLogger(__name__)

AUTHENTICATED_PREFIX = "/v1/"
LAST_USED_EVERY_SECONDS = 60
"""`api_keys.last_used_at` is kept to this precision: at most one write per key this often."""

AUTH_DISABLED_ACTOR = "auth-disabled"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: every query the request makes is scoped to `tenant_id`, and reads the
    documents `readers` may read (None: all of the tenant's). `actor` names the caller in the
    audit log (`key:<prefix>`, `user:<name>` for a signed token); `user` is the user a key or
    token acts for."""

    tenant_id: uuid.UUID
    role: Role
    key_id: uuid.UUID | None
    actor: str = AUTH_DISABLED_ACTOR
    key_prefix: str | None = None
    user: str | None = None
    readers: frozenset[str] | None = None

    @property
    def asker(self) -> str:
        """Who asked, as the query log and feedback record it."""
        return f"user:{self.user}" if self.user is not None else self.actor

    @property
    def rate_key(self) -> uuid.UUID | None:
        """What the rate limit counts by: the key, else (a signed token) the tenant's user."""
        if self.key_id is not None or self.user is None:
            return self.key_id
        return uuid.uuid5(self.tenant_id, f"user:{self.user}")

    def is_service_admin(self, default_tenant_id: uuid.UUID) -> bool:
        """Whether the caller may change what every tenant shares (the embedding model): an
        admin of the default tenant, the service operator's, or anyone when auth is off."""
        return self.role is Role.ADMIN and self.tenant_id == default_tenant_id


def failure_limiter(per_minute: int) -> RateLimiter | None:
    """Failed authentications per client address: `per_minute`, in bursts of as many."""
    if per_minute == 0:
        return None
    return RateLimiter(per_second=per_minute / 60, burst=per_minute)


class AuthMiddleware:
    """Resolves the caller of every `/v1/` request into `scope["state"]["principal"]` (and the
    request's tenant), or answers 401 (no key, unknown, revoked, expired) or 429 (this client
    address failed too often) before the application sees the request."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        failures: RateLimiter | None,
        tokens: TokenVerifier | None = None,
        groups_from: GroupsFrom = "token",
    ) -> None:
        self.app = app
        self.failures = failures
        self.tokens = tokens
        self.groups_from = groups_from

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(AUTHENTICATED_PREFIX):
            await self.app(scope, receive, send)
            return
        try:
            principal = await self._authenticate(scope)
        except RagServiceError as exc:
            await _refusal(scope, exc)(scope, receive, send)
            return
        except (OperationalError, DriverOperationalError) as exc:
            # Outside the app's error handlers: the same answer they give (`error_handlers`).
            log.error("request %s: database unavailable: %s", _request_id(scope), exc)
            unavailable = DatabaseUnavailableError("the database is unavailable")
            await _refusal(scope, unavailable)(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = principal
        logs.set_request_tenant(principal.tenant_id)  # on the request's log lines from here
        db_scope = current_scope()
        if db_scope is not None:
            # From here on the request's transactions see this tenant's rows only, and of its
            # documents those the caller may read (`tenancy`).
            db_scope.tenant_id = principal.tenant_id
            db_scope.readers = principal.readers
            db_scope.asker = principal.asker
        await self.app(scope, receive, send)

    async def _authenticate(self, scope: Scope) -> Principal:
        runtime: Runtime = scope["app"].state.runtime
        if runtime.settings.security.auth_disabled:
            return Principal(tenant_id=runtime.default_tenant_id, role=Role.ADMIN, key_id=None)
        metrics: Metrics = scope["app"].state.metrics
        secret = _secret(scope)
        if not secret:
            metrics.auth_refused.labels(reason="missing").inc()
            raise AuthenticationError("missing API key: send `Authorization: Bearer <key>`")
        address = _client_address(scope)
        self._check_lockout(address, metrics)
        try:
            if self.tokens is not None and looks_like_jwt(secret):
                return await anyio.to_thread.run_sync(
                    self._token_principal, runtime, metrics, secret
                )
            key = await anyio.to_thread.run_sync(_lookup, runtime, hash_key(secret))
            return _principal(runtime, key, metrics)
        except AuthenticationError:
            if self.failures is not None:
                self.failures.acquire(address)
            raise

    def _token_principal(self, runtime: Runtime, metrics: Metrics, token: str) -> Principal:
        """The caller a gateway's signed token names (`auth.tokens`): its tenant (by name), its
        user, and the user's groups from the token, the store or both (`jwt_groups_from`)."""
        assert self.tokens is not None
        try:
            identity = self.tokens.verify(token)
        except AuthenticationError:
            metrics.auth_refused.labels(reason="token").inc()
            raise
        with tenancy.as_system(), runtime.db.read(primary=True) as session:
            tenant_id = store.tenants.find_tenant_id(session, identity.tenant)
            stored: list[str] = []
            if tenant_id is not None and self.groups_from != "token":
                stored = store.tenants.user_groups(session, tenant_id, identity.user)
        if tenant_id is None:
            metrics.auth_refused.labels(reason="token").inc()
            raise AuthenticationError("invalid claim: tenant (no such tenant)")
        groups = set(stored) | (set(identity.groups) if self.groups_from != "store" else set())
        try:
            readers = principal_set(identity.user, groups)
        except InvalidInputError:
            metrics.auth_refused.labels(reason="token").inc()
            raise AuthenticationError(
                "invalid claim: a user or group name outside letters, digits and ._@+-"
            ) from None
        return Principal(
            tenant_id=tenant_id,
            role=identity.role,
            key_id=None,
            actor=f"user:{identity.user}",
            user=identity.user,
            readers=readers,
        )

    def _check_lockout(self, address: str, metrics: Metrics) -> None:
        if self.failures is None:
            return
        wait = self.failures.waiting(address)
        if wait > 0:
            metrics.auth_refused.labels(reason="locked_out").inc()
            raise RateLimitedError(
                f"too many failed authentications from {address}: at most "
                f"{self.failures.burst} a minute (RAGSERVICE_AUTH_FAILURES_PER_MINUTE); "
                "retry after the seconds in Retry-After",
                retry_after=wait,
            )


@dataclass(frozen=True, slots=True)
class _FoundKey:
    key: ApiKey
    groups: list[str]


def _lookup(runtime: Runtime, key_hash: str) -> _FoundKey | None:
    # The key decides the tenant, so finding it is the one read of a request across tenants.
    # On the primary: a revoked key must not live on for as long as a replica lags, nor a
    # user's group membership once removed.
    with tenancy.as_system(), runtime.db.read(primary=True) as session:
        key = store.tenants.get_api_key(session, key_hash)
        if key is None:
            return None
        groups = (
            []
            if key.user_name is None
            else store.tenants.user_groups(session, key.tenant_id, key.user_name)
        )
        return _FoundKey(key, groups)


def key_readers(
    role: Role, user: str | None, groups: list[str], prefix: str
) -> frozenset[str] | None:
    """What a key reads: its user's and groups' documents; a key of no user, every document
    of its tenant if it is an admin's, else the unrestricted ones only (fail closed). The key
    itself is in the set too: what it queued is its own."""
    if user is not None:
        return principal_set(user, groups, key_prefix=prefix)
    return None if role is Role.ADMIN else principal_set(None, key_prefix=prefix)


def _principal(runtime: Runtime, found: _FoundKey | None, metrics: Metrics) -> Principal:
    if found is None:
        metrics.auth_refused.labels(reason="unknown").inc()
        raise AuthenticationError("unknown or revoked API key")
    key = found.key
    now = datetime.now(UTC)
    if key.expires_at is not None and key.expires_at <= now:
        metrics.auth_refused.labels(reason="expired").inc()
        raise AuthenticationError(
            f"API key expired at {key.expires_at.isoformat(timespec='seconds')}"
        )
    last_used = key.last_used_at
    if last_used is None or (now - last_used).total_seconds() >= LAST_USED_EVERY_SECONDS:
        runtime.db.write_later(
            partial(
                store.tenants.touch_api_key, key_id=key.id, every_seconds=LAST_USED_EVERY_SECONDS
            )
        )
    role = Role(key.role)
    return Principal(
        tenant_id=key.tenant_id,
        role=role,
        key_id=key.id,
        actor=f"key:{key.prefix}",
        key_prefix=key.prefix,
        user=key.user_name,
        readers=key_readers(role, key.user_name, found.groups, key.prefix),
    )


def _secret(scope: Scope) -> str | None:
    """The key from `Authorization: Bearer <key>`, else from `X-API-Key`."""
    headers = {
        bytes(name).decode("latin-1"): bytes(v).decode("latin-1") for name, v in scope["headers"]
    }
    scheme, _, credentials = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return headers.get("x-api-key") or None


def _client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def _refusal(scope: Scope, exc: RagServiceError) -> JSONResponse:
    """The error body every other error has (`error_handlers`), with its headers."""
    request_id = _request_id(scope)
    headers = {REQUEST_ID_HEADER: request_id}
    if isinstance(exc, AuthenticationError):
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(exc, RateLimitedError):
        headers["Retry-After"] = str(exc.retry_after)
    body = {
        "error": type(exc).__name__.removesuffix("Error"),
        "detail": str(exc),
        "request_id": request_id,
    }
    return JSONResponse(body, status_code=exc.status_code, headers=headers)


def _request_id(scope: Scope) -> str:
    return str(scope.get("state", {}).get("request_id", "-"))
