"""Sources of a collection: add (a web site, an S3 bucket), list, show with the last run, run
now, remove. Runs are ingest jobs (`/v1/jobs`); one per source at a time."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request, Response, status

from ragservice.api.deps import DatabaseDep, Reader, SettingsDep, Writer, wake_workers
from ragservice.api.schemas.common import error_responses
from ragservice.api.schemas.sources import RunQueued, SourceIn, SourceList, SourceOut, source_out
from ragservice.services import sources
from ragservice.services.sources import SourceSpec

router = APIRouter(
    prefix="/v1/collections/{collection}/sources",
    tags=["sources"],
    responses=error_responses(),
)


@router.post("", status_code=status.HTTP_201_CREATED, responses=error_responses(409))
def add_source(
    collection: str,
    body: SourceIn,
    principal: Writer,
    db: DatabaseDep,
    settings: SettingsDep,
    request: Request,
) -> SourceOut:
    """Add a source to the collection (created if missing) and, with `run`, queue its first
    run. 422 for a location the service may not read (a folder, a private address unless
    RAGSERVICE_SOURCES_ALLOW_PRIVATE, a bucket not listed) or an option its reader does not
    know; 409 when the collection has a source there already, or too many. Credentials, in
    the location or in `credentials`, are kept apart and never shown."""
    spec = SourceSpec(
        location=body.location,
        options=body.options,
        credentials=None if body.credentials is None else body.credentials.value(),
        readers=None if body.readers is None else tuple(body.readers),
        every_seconds=body.every_seconds,
        prune=body.prune,
    )
    view = sources.add_source(db, settings, principal, collection, spec)
    queued = None
    if body.run:
        queued = sources.queue_run(db, principal.tenant_id, collection, view.id)
        wake_workers(request)
    return source_out(view, queued)


@router.get("")
def list_sources(collection: str, principal: Reader, db: DatabaseDep) -> SourceList:
    """The collection's sources, oldest first, each with its last run."""
    found = sources.list_sources(db, principal.tenant_id, collection)
    return SourceList(sources=[source_out(view) for view in found])


@router.get("/{source_id}")
def get_source(
    collection: str, source_id: uuid.UUID, principal: Reader, db: DatabaseDep
) -> SourceOut:
    """A source with its last run: status, counts and per-document errors."""
    return source_out(sources.get_source(db, principal.tenant_id, collection, source_id))


@router.post(
    "/{source_id}/run", status_code=status.HTTP_202_ACCEPTED, responses=error_responses(409)
)
def run_source(
    collection: str,
    source_id: uuid.UUID,
    principal: Writer,
    db: DatabaseDep,
    request: Request,
    response: Response,
) -> RunQueued:
    """Queue a run of the source now; 409 while one is queued or running."""
    job_id = sources.queue_run(db, principal.tenant_id, collection, source_id)
    wake_workers(request)
    response.headers["Location"] = f"/v1/jobs/{job_id}"
    return RunQueued(job_id=job_id)


@router.delete("/{source_id}", status_code=status.HTTP_204_NO_CONTENT)
def remove_source(
    collection: str,
    source_id: uuid.UUID,
    principal: Writer,
    db: DatabaseDep,
    delete_documents: bool = False,
) -> Response:
    """Remove the source; with `delete_documents=true`, the documents it brought too (else
    they stay, as uploaded ones would)."""
    sources.remove_source(db, principal, collection, source_id, delete_documents=delete_documents)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
