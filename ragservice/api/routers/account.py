"""The caller's own account: its tenant, role and the server's limits, for a client (the web
console) to shape itself before it calls anything else."""

from __future__ import annotations

from fastapi import APIRouter

from ingest.loaders.formats import FORMATS
from ragservice.api.deps import DatabaseDep, PipelineDep, Reader, SettingsDep, is_service_admin
from ragservice.api.schemas.account import FormatsOut, MeOut, TenantOut, formats_out
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
        auth_disabled=settings.security.auth_disabled,
        service_admin=is_service_admin(principal),
        key_prefix=principal.key_prefix,
        user=principal.user,
        readers=None if principal.readers is None else sorted(principal.readers),
        max_file_bytes=settings.limits.max_file_bytes,
        max_files_per_upload=settings.limits.max_files_per_upload,
        cache_enabled=settings.cache.enabled,
        answer_model=pipeline.model_name,
    )


@router.get("/formats")
def formats(_principal: Reader) -> FormatsOut:
    """The file types an upload may hold (`POST /v1/collections/{collection}/documents/files`
    refuses others with 415): each with its suffixes, MIME types, what its citations name, the
    optional part of the install it needs and the limits it is held to."""
    return formats_out(FORMATS)
