"""Dependencies the routes declare: the runtime, the caller's identity, role and rate limit."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from ragservice import store
from ragservice.answering.answer import AnswerPipeline
from ragservice.api.authn import Principal as Principal  # routers name the caller's type here
from ragservice.api.charges import spend
from ragservice.auth.keys import Role
from ragservice.db.scope import current_scope
from ragservice.errors import AuthenticationError, InvalidInputError, PermissionDeniedError
from ragservice.limits.text import text_problem
from ragservice.retrieval.search import Searcher
from ragservice.runtime import Runtime

_bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer <API key>`")
_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False)


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def get_searcher(request: Request) -> Searcher:
    searcher: Searcher = request.app.state.searcher
    return searcher


def get_pipeline(request: Request) -> AnswerPipeline:
    pipeline: AnswerPipeline = request.app.state.pipeline
    return pipeline


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
SearcherDep = Annotated[Searcher, Depends(get_searcher)]
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
        principal.key_id,
        1,
        lambda limits: (
            f"this API key is over its rate limit of {limits.per_second:g} requests "
            f"per second (bursts of {limits.burst})"
        ),
    )


Reader = Annotated[Principal, Depends(require(Role.READER))]
Writer = Annotated[Principal, Depends(require(Role.WRITER))]
Admin = Annotated[Principal, Depends(require(Role.ADMIN))]


def require_service_admin(request: Request, principal: Admin) -> Principal:
    """An admin of the default tenant: what every tenant shares (the embedding model) is the
    service operator's to change, not any one tenant's."""
    if not principal.is_service_admin(get_runtime(request).default_tenant_id):
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


def collection_id(runtime: Runtime, tenant_id: uuid.UUID, name: str) -> uuid.UUID:
    """The id of the tenant's collection `name`; 404 for a name the tenant does not have."""
    with runtime.db.read() as session:
        return store.collections.require_collection_id(session, tenant_id, name)


def collection_ids(
    runtime: Runtime, tenant_id: uuid.UUID, names: list[str] | None
) -> list[uuid.UUID]:
    """Ids of the tenant's collections by name (all of them for None); 404 for a missing one."""
    with runtime.db.read() as session:
        return store.collections.require_collection_ids(session, tenant_id, names)


def audit(
    session: Session,
    principal: Principal,
    action: str,
    target: str,
    details: dict[str, Any] | None = None,
) -> None:
    """Record an admin action of the caller in its tenant's audit log, in `session`'s
    transaction: the action and its entry commit together or not at all."""
    store.audit.record(
        session,
        tenant_id=principal.tenant_id,
        key_id=principal.key_id,
        actor=principal.actor,
        action=action,
        target=target,
        details=details,
    )
