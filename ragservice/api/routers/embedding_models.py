"""The embedding model versions over HTTP: what `ragservice models list`, `activate` and
`rollback` do, for the web console. Every tenant's admin may look; only the service's admin
may switch, since the model is shared by every tenant."""

from __future__ import annotations

from contextlib import nullcontext

from fastapi import APIRouter

from ragservice.api.deps import Admin, RuntimeDep, ServiceAdmin
from ragservice.api.schemas.common import error_responses
from ragservice.api.schemas.embedding_models import (
    ActivateIn,
    ModelOut,
    ModelsOut,
    RollbackIn,
    SwitchOut,
)
from ragservice.db import tenancy
from ragservice.embedding import registry
from ragservice.runtime import Runtime

router = APIRouter(prefix="/v1/admin/models", tags=["admin"], responses=error_responses(409))


@router.get("")
def list_models(principal: Admin, runtime: RuntimeDep) -> ModelsOut:
    """Every registered model version, the active one marked. `embedded` and `chunks` count
    every tenant's chunks for the service admin (what an activation checks), and your own
    tenant's for any other admin."""
    service_admin = principal.is_service_admin(runtime.default_tenant_id)
    return ModelsOut(models=_rows(runtime, every_tenant=service_admin), can_switch=service_admin)


@router.post("/activate")
def activate(principal: ServiceAdmin, runtime: RuntimeDep, body: ActivateIn) -> SwitchOut:
    """Make `NAME[:VERSION]` the model every server serves (each switches within
    RAGSERVICE_MODEL_CHECK_SECONDS, after loading it). 409 while chunks lack its embeddings,
    unless `force`; 404 for a model that is not registered. Service admin only; audited."""
    switch = registry.activate(
        runtime.db, body.model, force=body.force, actor=principal.actor, key_id=principal.key_id
    )
    return _switched(runtime, switch)


@router.post("/rollback")
def rollback(principal: ServiceAdmin, runtime: RuntimeDep, body: RollbackIn) -> SwitchOut:
    """Activate again the model the latest activation replaced; 409 when there is none.
    Service admin only; audited."""
    switch = registry.rollback(
        runtime.db, force=body.force, actor=principal.actor, key_id=principal.key_id
    )
    return _switched(runtime, switch)


def _switched(runtime: Runtime, switch: registry.Switch) -> SwitchOut:
    rows = _rows(runtime, every_tenant=True, primary=True)  # the switch just committed there
    model = next(row for row in rows if row.id == switch.model.id)
    return SwitchOut(model=model, changed=switch.changed, previous_id=switch.previous_id)


def _rows(runtime: Runtime, *, every_tenant: bool, primary: bool = False) -> list[ModelOut]:
    # Within a request a transaction sees the caller's tenant's chunks; the service admin's
    # counts are the deployment's, as the activation checks them.
    tenants = tenancy.as_system() if every_tenant else nullcontext()
    with tenants, runtime.db.read(primary=primary) as session:
        statuses = registry.model_statuses(session)
    return [ModelOut.model_validate(registry.model_row(s, statuses)) for s in statuses]
