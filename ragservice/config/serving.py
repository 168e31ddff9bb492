"""Settings of a serving process: request limits, security, jobs, retention, observability."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator

from ragservice.config.group import SettingsGroup

SIGNING_ALGORITHMS = (
    *("RS256", "RS384", "RS512", "PS256", "PS384", "PS512"),
    *("ES256", "ES384", "ES512", "ES256K", "EdDSA"),
)
"""The algorithms `RAGSERVICE_JWT_ALGORITHMS` may name: asymmetric ones only, so the service
holds public keys and no secret a token could be forged with (never `none` nor `HS*`)."""

GroupsFrom = Literal["token", "store", "both"]
JwtAdmin = Literal["tenants", "all", "none"]


class LimitSettings(SettingsGroup):
    """The size of what a request may ask or send, and the work run at once."""

    max_k: int = Field(
        default=200,
        ge=1,
        le=1000,
        description="the largest `k` a search may ask for",
    )
    max_query_chars: int = Field(
        default=4000,
        ge=1,
        description="the longest search query",
    )
    max_body_bytes: int = Field(
        default=64 * 2**20,
        ge=1024,
        description="the largest request body",
    )
    max_file_bytes: int = Field(
        default=32 * 2**20,
        ge=1,
        description="the largest uploaded file",
    )
    max_files_per_upload: int = Field(
        default=1000,
        ge=1,
        description="files in one upload request",
    )
    max_batch_items: int = Field(
        default=2048,
        ge=1,
        description=(
            "texts in one JSON request: `documents` of `POST …/documents`, `input` of "
            "`/v1/embeddings` (more: 413)"
        ),
    )
    max_concurrent_embeddings: int | None = Field(
        default=None,
        ge=1,
        description=(
            "embedding computations (a query, or a batch of `EMBED_BATCH_SIZE` texts) "
            "running at once per loaded model; more wait their turn, tenants taking turns"
            " (the one holding fewest goes first); unset: the CPUs this process may use"
        ),
    )
    max_concurrent_upstream: int = Field(
        default=16,
        ge=1,
        description=(
            "calls to the inference layer in flight at once per process; more wait "
            "(tenants taking turns, the one holding fewest first), and one still waiting "
            "at its deadline (connect + read timeout) fails with 504"
        ),
    )
    max_concurrent_upstream_per_tenant: int | None = Field(
        default=None,
        ge=1,
        description=(
            "inference calls one tenant holds at once, so a slot stays free for other "
            "tenants; unset: all but one of `RAGSERVICE_MAX_CONCURRENT_UPSTREAM`"
        ),
    )
    max_answer_tokens: int = Field(
        default=2048,
        ge=1,
        description=(
            "largest `max_tokens` / `max_completion_tokens` a chat request may ask (more: 422)"
        ),
    )
    max_chat_messages: int = Field(
        default=50,
        ge=1,
        description="messages in one `/v1/chat/completions` request (more: 422)",
    )
    max_chat_chars: int = Field(
        default=32_000,
        ge=1,
        description=(
            "characters of the conversation and question a chat request passes upstream (more: 422)"
        ),
    )
    max_embedding_inputs: int = Field(
        default=256,
        ge=1,
        description="texts in one `/v1/embeddings` request (more: 413)",
    )
    max_embedding_input_chars: int = Field(
        default=8_000,
        ge=1,
        description="characters of one `/v1/embeddings` text (more: 422)",
    )
    max_embedding_request_chars: int = Field(
        default=500_000,
        ge=1,
        description="characters of all the texts of one `/v1/embeddings` request (more: 413)",
    )


class SecuritySettings(SettingsGroup):
    """API keys, signed tokens (OIDC/JWT), rate limits and row-level security."""

    auth_disabled: bool = Field(
        default=False,
        description=(
            "serve without API keys (every request is the default tenant's admin); "
            "refused unless the server binds a loopback address. `make run` sets it."
        ),
    )
    auth_failures_per_minute: int = Field(
        default=30,
        ge=0,
        description=(
            "requests with a wrong, revoked or expired API key one client address may "
            "make per minute (bursts of as many); beyond, 429 with `Retry-After` without "
            "a database read; `0`: no limit"
        ),
    )
    rate_limit_per_second: float = Field(
        default=20.0,
        ge=0,
        description=(
            "sustained rate-limit tokens per second per API key (more: 429 with "
            "`Retry-After`); a request costs 1, an answer 4, `/v1/embeddings` 1 per 16 "
            "texts (docs/api.md); `0` turns rate limiting off. Counted in each server "
            "process's memory, so N processes allow a key N times this. Not applied with "
            "`RAGSERVICE_AUTH_DISABLED` (no keys)"
        ),
    )
    rate_limit_burst: int = Field(
        default=40,
        ge=1,
        description=(
            "tokens a key may spend at once (its token bucket's size) before the "
            "sustained rate applies"
        ),
    )
    allow_no_row_security: bool = Field(
        default=False,
        description=(
            "`1`: serve even when row-level security cannot bind the service: its roles "
            "are missing, or its login is a superuser, BYPASSRLS or the tables' owner "
            "(the service refuses to start otherwise)"
        ),
    )
    jwt_jwks: str | None = Field(
        default=None,
        description=(
            "the public keys that sign the tokens a trusted gateway sends "
            "(`Authorization: Bearer <jwt>`): a JWKS file's path (read again when it "
            "changes), or its `https://` URL (fetched with a 5 s timeout, kept 5 minutes; "
            "plain `http://` is meant for this machine); unset or empty: API keys only (see "
            "[permissions.md](permissions.md#signed-tokens-oidcjwt))"
        ),
    )
    jwt_issuer: str | None = Field(
        default=None,
        description="the `iss` every token must carry; required with `RAGSERVICE_JWT_JWKS`",
    )
    jwt_audience: str | None = Field(
        default=None,
        validate_default=True,  # its validator checks the three settings together
        description=(
            "the audience every token's `aud` must name (or contain); required with "
            "`RAGSERVICE_JWT_JWKS`"
        ),
    )
    jwt_algorithms: str = Field(
        default="RS256,ES256",
        description=(
            "comma-separated signing algorithms a token may use; asymmetric only "
            f"({', '.join(SIGNING_ALGORITHMS)}): `none` and `HS*` are refused at start"
        ),
    )
    jwt_leeway_seconds: int = Field(
        default=30,
        ge=0,
        le=300,
        description="clock skew allowed when checking a token's `exp`, `nbf` and `iat`",
    )
    jwt_user_claim: str = Field(
        default="sub",
        min_length=1,
        description="the claim naming the token's user",
    )
    jwt_groups_claim: str = Field(
        default="groups",
        min_length=1,
        description="the claim listing the user's groups (strings); absent: no groups",
    )
    jwt_tenant_claim: str = Field(
        default="tenant",
        min_length=1,
        description="the claim naming the tenant (by its name); a token without it is refused",
    )
    jwt_role_claim: str = Field(
        default="role",
        min_length=1,
        description="the claim holding the role (`reader`, `writer`, `admin`); absent: `reader`",
    )
    jwt_groups_from: GroupsFrom = Field(
        default="token",
        description=(
            "where a token user's groups come from: the token's groups claim, the groups "
            "the service stores for the user, or both"
        ),
    )
    jwt_key_tenants: str | None = Field(
        default=None,
        description=(
            "which tenants each key of the JWKS may sign tokens for: comma-separated "
            "`kid=tenant` pairs, several tenants joined by `|`, `*` for all "
            "(`gw-acme=acme,gw-ops=acme|globex,gw-admin=*`); a key not named signs for "
            "none. Unset or empty: every key signs for every tenant"
        ),
    )
    jwt_admin: JwtAdmin = Field(
        default="tenants",
        description=(
            "whose `admin` role a token may carry: `tenants`, any tenant's but the default "
            "tenant's (whose admins change what all tenants share, the embedding model); "
            "`all`, the default tenant's too; `none`, no token is an admin (API keys only)"
        ),
    )

    @field_validator("jwt_jwks", mode="before")
    @classmethod
    def _blank_jwks_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("jwt_key_tenants", mode="before")
    @classmethod
    def _key_tenants_parse(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            return None
        if isinstance(value, str):
            key_tenants(value)  # ValueError naming what is wrong
        return value

    @field_validator("jwt_algorithms", mode="before")
    @classmethod
    def _algorithms_allowed(cls, value: Any) -> Any:
        names = value.split(",") if isinstance(value, str) else value
        if not isinstance(names, list | tuple):
            return value  # the field's own type check refuses it
        allowed = [signing_algorithm(str(name)) for name in names if str(name).strip()]
        if not allowed:
            raise ValueError("RAGSERVICE_JWT_ALGORITHMS names no algorithm")
        return ",".join(allowed)

    # A field's validator, not the model's: a model's error would quote every setting given,
    # secrets included.
    @field_validator("jwt_audience")
    @classmethod
    def _tokens_need_issuer_and_audience(
        cls, value: str | None, info: ValidationInfo
    ) -> str | None:
        if info.data.get("jwt_jwks") is not None and not (value and info.data.get("jwt_issuer")):
            raise ValueError(
                "RAGSERVICE_JWT_JWKS needs RAGSERVICE_JWT_ISSUER and RAGSERVICE_JWT_AUDIENCE"
            )
        return value

    def jwt_algorithm_names(self) -> tuple[str, ...]:
        """`RAGSERVICE_JWT_ALGORITHMS` as a tuple of algorithm names, e.g. ("RS256", "ES256")."""
        return tuple(name for name in self.jwt_algorithms.split(",") if name)

    def jwt_key_tenant_names(self) -> dict[str, frozenset[str] | None] | None:
        """`RAGSERVICE_JWT_KEY_TENANTS` by key id: its tenants' names, None for all (`*`);
        None when unset (every key signs for every tenant)."""
        return None if self.jwt_key_tenants is None else key_tenants(self.jwt_key_tenants)


def key_tenants(value: str) -> dict[str, frozenset[str] | None]:
    """`kid=acme|globex,kid2=*` by key id (None: every tenant), or ValueError."""
    found: dict[str, frozenset[str] | None] = {}
    for item in value.split(","):
        if not item.strip():
            continue
        kid, sep, names = (part.strip() for part in item.partition("="))
        tenants = [name.strip() for name in names.split("|")]
        if not (sep and kid and all(tenants)) or any(" " in name for name in tenants):
            raise ValueError(
                f"RAGSERVICE_JWT_KEY_TENANTS: {item.strip()[:80]!r} is not "
                "`kid=tenant`, `kid=tenant|tenant` or `kid=*`"
            )
        if kid in found:
            raise ValueError(f"RAGSERVICE_JWT_KEY_TENANTS names key {kid[:80]!r} twice")
        found[kid] = None if tenants == ["*"] else frozenset(tenants)
    return found


def signing_algorithm(name: str) -> str:
    """One of `SIGNING_ALGORITHMS`, spelt as JWT spells it (`rs256` → `RS256`), or ValueError."""
    by_lower = {known.lower(): known for known in SIGNING_ALGORITHMS}
    found = by_lower.get(name.strip().lower())
    if found is None:
        raise ValueError(
            f"RAGSERVICE_JWT_ALGORITHMS: {name.strip()!r} is not allowed; tokens are verified "
            f"with public keys only: {', '.join(SIGNING_ALGORITHMS)} (never none or HS*)"
        )
    return found


class JobSettings(SettingsGroup):
    """Ingest job workers and the queue."""

    workers: int = Field(
        default=1,
        ge=0,
        le=64,
        description=(
            "ingest job threads inside `ragservice serve` (0: leave jobs to `ragservice "
            "worker` processes)"
        ),
    )
    poll_seconds: float = Field(
        validation_alias="job_poll_seconds",
        default=1.0,
        gt=0,
        description=(
            "how often idle workers look for queued jobs (an upload in the same process "
            "wakes them at once)"
        ),
    )
    stale_seconds: float = Field(
        validation_alias="job_stale_seconds",
        default=120.0,
        gt=0,
        description=(
            "a running job whose worker sent no heartbeat this long is taken over by "
            "another worker (a worker that died is taken over at once: its claim's "
            "advisory lock ends with its connection)"
        ),
    )
    max_attempts: int = Field(
        validation_alias="job_max_attempts",
        default=3,
        ge=1,
        description="attempts before a job whose workers keep dying is marked failed",
    )


class RetentionSettings(SettingsGroup):
    """How long the query log and jobs' payloads are kept."""

    query_log_days: int = Field(
        validation_alias="query_log_retention_days",
        default=90,
        ge=0,
        description=(
            "logged questions, answers and prompts older than this are deleted, with "
            "their feedback; `0` keeps them for ever (see "
            "[operators.md](operators.md#retention-and-erasure))"
        ),
    )
    job_payload_hours: float = Field(
        validation_alias="job_payload_retention_hours",
        default=24.0,
        ge=0,
        description=(
            "the uploaded files and texts of a failed job are dropped this long after it "
            "ended, so it can be queued again meanwhile (a done job drops them at once); "
            "`0`: at the next purge"
        ),
    )
    purge_seconds: float = Field(
        validation_alias="retention_purge_seconds",
        default=3600.0,
        gt=0,
        description=(
            "how often each server runs the retention purge (`ragservice db purge` runs it once)"
        ),
    )


class ObservabilitySettings(SettingsGroup):
    """Logs, Prometheus metrics and OpenTelemetry traces."""

    log_level: str = Field(
        default="INFO",
        description="Python log level",
    )
    log_format: Literal["text", "json"] = Field(
        default="text",
        description=(
            "`text` (`LEVEL logger: message`) or `json`: one JSON object a line with "
            "`timestamp`, `level`, `logger`, `message` and the request's `request_id`, "
            "`tenant`, `route` (plus an access line per request); for `serve`, `worker` "
            "and every command (see [operators.md](operators.md#structured-logs))"
        ),
    )
    tracing: bool = Field(
        default=False,
        description=(
            "OpenTelemetry traces of requests (`pip install 'ragservice[otel]'`), "
            "exported as the standard `OTEL_*` variables say (see "
            "[operators.md](operators.md#tracing))"
        ),
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="when set, `GET /metrics` needs `Authorization: Bearer <this token>`",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description=(
            "serve `/metrics` on this port of `RAGSERVICE_METRICS_HOST` instead of the "
            "API's port (no token there)"
        ),
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description=(
            "bind address of `RAGSERVICE_METRICS_PORT` and of `ragservice worker`'s metrics port"
        ),
    )
    worker_metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description=(
            "`ragservice worker` serves Prometheus metrics on this port of "
            "`RAGSERVICE_METRICS_HOST` (`--metrics-port`, `--metrics-host`); unset: none."
            ' The metrics and the Grafana dashboard: docs/operators.md, "Metrics"'
        ),
    )


class ServerSettings(SettingsGroup):
    """Where `ragservice serve` listens, the console, and how it stops."""

    host: str = Field(
        default="127.0.0.1",
        description="where `ragservice serve` listens",
    )
    port: int = Field(
        default=8000,
        ge=1,
        le=65535,
        description="the port `ragservice serve` listens on",
    )
    console: bool = Field(
        default=True,
        description=(
            "serve the web console at `/ui` ([console.md](console.md)); `false`: the API alone"
        ),
    )
    shutdown_grace_seconds: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description=(
            "on SIGTERM or SIGINT, `serve` and `worker` end open streamed answers (a last"
            " `ServiceStopping` event), put running jobs back in the queue and stop, the "
            "embedded PostgreSQL included, within this many seconds (see "
            "[operators.md](operators.md#stopping))"
        ),
    )
