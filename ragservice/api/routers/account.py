"""The caller's own account: its tenant, role and the server's limits, for a client (the web
console) to shape itself before it calls anything else."""

from __future__ import annotations

from fastapi import APIRouter

from ragservice.api.deps import DatabaseDep, PipelineDep, Reader, SettingsDep, is_service_admin
from ragservice.api.schemas.account import MeOut, TenantOut
from ragservice.api.schemas.common import error_responses
from ragservice.services.account import tenant_name

router = APIRouter(prefix="/v1", tags=["account"], responses=error_responses())


@router.get("/me")
def me(principal: Reader, db: DatabaseDep, settings: SettingsDep, pipeline: PipelineDep) -> MeOut:
    """Your tenant, your key's role and prefix, and the limits and features of this server.
    `service_admin`: whether you may switch the embedding model (`/v1/admin/models`)."""
    return MeOut(
        tenant=TenantOut(id=principal.tenant_id, name=tenant_name(db, principal.tenant_id)),
        role=principal.role,
        auth_disabled=settings.auth_disabled,
        service_admin=is_service_admin(principal),
        key_prefix=principal.key_prefix,
        user=principal.user,
        readers=None if principal.readers is None else sorted(principal.readers),
        max_file_bytes=settings.max_file_bytes,
        max_files_per_upload=settings.max_files_per_upload,
        cache_enabled=settings.cache_enabled,
        answer_model=pipeline.model_name,
    )
