"""The embedding model versions over HTTP: what `ragservice models list`, `activate` and
`rollback` do, for the web console. Every tenant's admin may look; only the service's admin
may switch, since the model is shared by every tenant."""

from __future__ import annotations

from fastapi import APIRouter

from ragservice.api.deps import Admin, DatabaseDep, ServiceAdmin, is_service_admin
from ragservice.api.schemas.common import error_responses
from ragservice.api.schemas.models import (
    ActivateIn,
    ModelOut,
    ModelsOut,
    RollbackIn,
    SwitchOut,
)
from ragservice.services import models
from ragservice.services.models import Switched

router = APIRouter(prefix="/v1/admin/models", tags=["admin"], responses=error_responses(409))


@router.get("")
def list_models(principal: Admin, db: DatabaseDep) -> ModelsOut:
    """Every registered model version, the active one marked. `embedded` and `chunks` count
    every tenant's chunks for the service admin (what an activation checks), and your own
    tenant's for any other admin."""
    service_admin = is_service_admin(principal)
    rows = models.model_rows(db, every_tenant=service_admin)
    return ModelsOut(
        models=[ModelOut.model_validate(row) for row in rows], can_switch=service_admin
    )


@router.post("/activate")
def activate(principal: ServiceAdmin, db: DatabaseDep, body: ActivateIn) -> SwitchOut:
    """Make `NAME[:VERSION]` the model every server serves (each switches within
    RAGSERVICE_MODEL_CHECK_SECONDS, after loading it). 409 while chunks lack its embeddings,
    unless `force`; 404 for a model that is not registered. Service admin only; audited."""
    return _switched(models.activate(db, principal, body.model, force=body.force))


@router.post("/rollback")
def rollback(principal: ServiceAdmin, db: DatabaseDep, body: RollbackIn) -> SwitchOut:
    """Activate again the model the latest activation replaced; 409 when there is none.
    Service admin only; audited."""
    return _switched(models.rollback(db, principal, force=body.force))


def _switched(switch: Switched) -> SwitchOut:
    return SwitchOut(
        model=ModelOut.model_validate(switch.model),
        changed=switch.changed,
        previous_id=switch.previous_id,
    )
