"""Admin endpoints: the tenant's audit log and insights, and the service's health in detail."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from ragservice import store
from ragservice.api.deps import Admin, RuntimeDep, collection_id
from ragservice.api.schemas.audit import MAX_AUDIT_PAGE, AuditPage, audit_page
from ragservice.api.schemas.common import error_responses
from ragservice.api.schemas.insights import MAX_INSIGHT_DAYS, InsightsOut, insights_out
from ragservice.db import migrate
from ragservice.limits.shape import MAX_INT8
from ragservice.runtime import Runtime

router = APIRouter(prefix="/v1", tags=["admin"], responses=error_responses())


@router.get("/audit")
def list_audit(
    principal: Admin,
    runtime: RuntimeDep,
    limit: Annotated[int, Query(ge=1, le=MAX_AUDIT_PAGE)] = 100,
    before: Annotated[int | None, Query(ge=1, le=MAX_INT8)] = None,
) -> AuditPage:
    """Your tenant's audit log, newest first: collection deletes and updates, cache purges,
    feedback exports, key creations and revocations. Page with `before=next_before`."""
    with runtime.db.read() as session:
        entries = store.audit.list_entries(session, principal.tenant_id, limit=limit, before=before)
    return audit_page(entries, limit)


@router.get("/insights")
def insights(
    principal: Admin,
    runtime: RuntimeDep,
    days: Annotated[int, Query(ge=1, le=MAX_INSIGHT_DAYS)] = 30,
    collection: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
) -> InsightsOut:
    """Your tenant's questions per day, cache hit rate per day, latency per stage, weakest
    retrievals and newest bad ratings over the last `days` UTC days: the figures analysts
    read in the `analytics` views. `collection`: its questions only (404 if not yours)."""
    cid = None if collection is None else collection_id(runtime, principal.tenant_id, collection)
    with runtime.db.read() as session:
        found = store.insights.insights(session, principal.tenant_id, days=days, collection_id=cid)
    return insights_out(found, days)


@router.get("/admin/health")
def health(_principal: Admin, runtime: RuntimeDep) -> JSONResponse:
    """Readiness in detail: each check, the embedding model being served (it changes within
    RAGSERVICE_MODEL_CHECK_SECONDS of an activation, plus its load), and each replica's role,
    health, lag and last error (from the background checks), and on a supervised embedded
    PostgreSQL its state, exits, restarts and back-off. 503 when not ready, like `/readyz`;
    a replica that is down does not make the server unready."""
    ready, body = readiness(runtime)
    return JSONResponse(body, status_code=200 if ready else 503)


def readiness(runtime: Runtime) -> tuple[bool, dict[str, Any]]:
    """Whether the server is ready (primary reachable, schema current, model loaded, and the
    embedded PostgreSQL running when this process supervises it), and the details: the
    checks, the model, the nodes and the embedded server's supervision."""
    model = runtime.models.current()
    checks = {"database": False, "migrations": False, "model": model.embedder.dimension > 0}
    try:
        checks["migrations"] = migrate.is_current(runtime.db.write_engine)
        checks["database"] = True
    except Exception:  # reported as not ready, never as a 500
        pass
    supervised = None if runtime.supervisor is None else runtime.supervisor.status()
    if supervised is not None:
        checks["embedded_postgres"] = supervised.up
    ready = all(checks.values())
    body: dict[str, Any] = {"ready": ready, "checks": checks, "model": model.describe()}
    if runtime.db.router is not None:
        body["nodes"] = runtime.db.router.status()
    if supervised is not None:
        body["embedded_postgres"] = supervised.describe()
    return ready, body
