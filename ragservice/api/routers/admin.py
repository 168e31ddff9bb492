"""Admin endpoints: the tenant's audit log and insights, and the service's health in detail."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from ragservice.api.deps import Admin, DatabaseDep, ModelsDep, SupervisorDep
from ragservice.api.schemas.audit import MAX_AUDIT_PAGE, AuditPage, audit_page
from ragservice.api.schemas.common import error_responses
from ragservice.api.schemas.insights import MAX_INSIGHT_DAYS, InsightsOut, insights_out
from ragservice.bootstrap import Runtime
from ragservice.limits import MAX_INT8
from ragservice.services import admin
from ragservice.services import health as server_health

router = APIRouter(prefix="/v1", tags=["admin"], responses=error_responses())


@router.get("/audit")
def list_audit(
    principal: Admin,
    db: DatabaseDep,
    limit: Annotated[int, Query(ge=1, le=MAX_AUDIT_PAGE)] = 100,
    before: Annotated[int | None, Query(ge=1, le=MAX_INT8)] = None,
) -> AuditPage:
    """Your tenant's audit log, newest first: collection deletes and updates, cache purges,
    feedback exports, key creations and revocations. Page with `before=next_before`."""
    entries = admin.audit_entries(db, principal.tenant_id, limit=limit, before=before)
    return audit_page(entries, limit)


@router.get("/insights")
def insights(
    principal: Admin,
    db: DatabaseDep,
    days: Annotated[int, Query(ge=1, le=MAX_INSIGHT_DAYS)] = 30,
    collection: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
) -> InsightsOut:
    """Your tenant's questions per day, cache hit rate per day, latency per stage, weakest
    retrievals and newest bad ratings over the last `days` UTC days: the figures analysts
    read in the `analytics` views. `collection`: its questions only (404 if not yours)."""
    found = admin.insights(db, principal.tenant_id, days=days, collection=collection)
    return insights_out(found, days)


@router.get("/admin/health")
def health(
    _principal: Admin, db: DatabaseDep, models: ModelsDep, supervisor: SupervisorDep
) -> JSONResponse:
    """Readiness in detail: each check, the embedding model being served (it changes within
    RAGSERVICE_MODEL_CHECK_SECONDS of an activation, plus its load), and each replica's role,
    health, lag and last error (from the background checks), and on a supervised embedded
    PostgreSQL its state, exits, restarts and back-off. 503 when not ready, like `/readyz`;
    a replica that is down does not make the server unready."""
    found = server_health.readiness(db, models, supervisor)
    return JSONResponse(found.details, status_code=200 if found.ready else 503)


def readiness(runtime: Runtime) -> tuple[bool, dict[str, Any]]:
    """Whether the server is ready, and the details (`services/health.py`), for `/readyz`."""
    found = server_health.readiness(runtime.db, runtime.models, runtime.supervisor)
    return found.ready, found.details
