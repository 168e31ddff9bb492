"""Dependencies the routes declare: narrow parts of the runtime (the database, the settings,
the model registry, the supervisor, the search and answer services), the caller's identity,
role and rate limit."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from ragservice.answering.answer import AnswerPipeline
from ragservice.api.authn import Principal as Principal  # routers name the caller's type here
from ragservice.api.charges import spend
from ragservice.auth.keys import Role
from ragservice.config import DEFAULT_TENANT_ID, Settings
from ragservice.db import Database
from ragservice.db.scope import current_scope
from ragservice.db.supervisor import EmbeddedSupervisor
from ragservice.embedding.registry import ModelRegistry
from ragservice.errors import AuthenticationError, InvalidInputError, PermissionDeniedError
from ragservice.limits.text import text_problem
from ragservice.runtime import Runtime
from ragservice.services.answers import AnswerService
from ragservice.services.search import SearchService

_bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer <API key>`")
_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False)


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def get_search(request: Request) -> SearchService:
    search: SearchService = request.app.state.search
    return search


def get_answers(request: Request) -> AnswerService:
    answers: AnswerService = request.app.state.answers
    return answers


def get_pipeline(request: Request) -> AnswerPipeline:
    return get_answers(request).pipeline


def get_database(request: Request) -> Database:
    return get_runtime(request).db


def get_settings(request: Request) -> Settings:
    """The settings the app was built with (not the environment's at this moment)."""
    return get_runtime(request).settings


def get_models(request: Request) -> ModelRegistry:
    return get_runtime(request).models


def get_supervisor(request: Request) -> EmbeddedSupervisor | None:
    """The supervisor of the embedded PostgreSQL, when this server watches one."""
    return get_runtime(request).supervisor


SearchDep = Annotated[SearchService, Depends(get_search)]
AnswersDep = Annotated[AnswerService, Depends(get_answers)]
DatabaseDep = Annotated[Database, Depends(get_database)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
ModelsDep = Annotated[ModelRegistry, Depends(get_models)]
SupervisorDep = Annotated[EmbeddedSupervisor | None, Depends(get_supervisor)]
PipelineDep = Annotated[AnswerPipeline, Depends(get_pipeline)]


async def replica_reads() -> None:
    """For routes that write nothing though they are POSTs (search, query, chat): their reads,
    the API key lookup included, may be served by a replica. Declared on the router, so it runs
    before every other dependency."""
    scope = current_scope()
    if scope is not None:
        scope.replica_reads = True


def storable_parameters(request: Request) -> None:
    """422 naming a path or query parameter that holds a NUL character (a URL's `%00`), as
    the bodies' text fields refuse it (declared on the app, so it runs for every route)."""
    for name, value in (*request.path_params.items(), *request.query_params.multi_items()):
        if isinstance(value, str) and (problem := text_problem(value)):
            raise InvalidInputError(f"{name}: {problem}")


def authenticate(
    request: Request,
    _bearer_key: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    _header_key: Annotated[str | None, Depends(_api_key_header)],
) -> Principal:
    """The caller, as `authn.AuthMiddleware` resolved it before the body was read. (The two
    security dependencies only document the ways to send a key in the OpenAPI schema.)"""
    principal = request.scope.get("state", {}).get("principal")
    if not isinstance(principal, Principal):
        raise AuthenticationError("missing API key: send `Authorization: Bearer <key>`")
    return principal


def require(role: Role) -> Callable[[Request, Principal], Principal]:
    def check(
        request: Request, principal: Annotated[Principal, Depends(authenticate)]
    ) -> Principal:
        rate_limit(request, principal)
        if not principal.role.allows(role):
            raise PermissionDeniedError(
                f"this needs {_article(role)} {role} key; this key is {_article(principal.role)} "
                f"{principal.role}"
            )
        return principal

    return check


def _article(role: Role) -> str:
    return "an" if role.value[0] in "aeiou" else "a"


def rate_limit(request: Request, principal: Principal) -> None:
    """Take one of the key's tokens, or refuse with 429. Without authentication there is no
    key to limit (such a server listens on loopback only), so nothing is limited then."""
    spend(
        request,
        principal.rate_key,
        1,
        lambda limits: (
            f"this API key is over its rate limit of {limits.per_second:g} requests "
            f"per second (bursts of {limits.burst})"
        ),
    )


Reader = Annotated[Principal, Depends(require(Role.READER))]
Writer = Annotated[Principal, Depends(require(Role.WRITER))]
Admin = Annotated[Principal, Depends(require(Role.ADMIN))]


def is_service_admin(principal: Principal) -> bool:
    """Whether the caller is an admin of the default tenant, the service operator's."""
    return principal.is_service_admin(uuid.UUID(DEFAULT_TENANT_ID))


def require_service_admin(principal: Admin) -> Principal:
    """An admin of the default tenant: what every tenant shares (the embedding model) is the
    service operator's to change, not any one tenant's."""
    if not is_service_admin(principal):
        raise PermissionDeniedError(
            "the embedding model is shared by every tenant: only an admin key of the default "
            "tenant (the service operator's) may switch it; this key is an admin of its own "
            "tenant only"
        )
    return principal


ServiceAdmin = Annotated[Principal, Depends(require_service_admin)]


def wake_workers(request: Request) -> None:
    """Have the app's job workers look for a job now (one was just queued)."""
    for service in request.app.state.services:
        wake = getattr(service, "wake", None)
        if wake is not None:
            wake()
