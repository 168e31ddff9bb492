"""Ingest jobs: status, counts and per-file errors of uploads, and queuing a failed one again."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status

from ragservice.api.deps import DatabaseDep, Reader, Writer, wake_workers
from ragservice.api.schemas.common import error_responses
from ragservice.api.schemas.jobs import JobList, JobOut, JobStatusParameter, job_out
from ragservice.services import jobs
from ragservice.types import JobStatus

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=error_responses())


@router.get("/{job_id}")
def get_job(job_id: uuid.UUID, principal: Reader, db: DatabaseDep) -> JobOut:
    """A job's status (queued, running, done, failed), counts and per-file errors."""
    return job_out(jobs.get_job(db, principal.tenant_id, job_id))


@router.get("")
def list_jobs(
    principal: Reader,
    db: DatabaseDep,
    collection: str | None = None,
    status: JobStatusParameter | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> JobList:
    """The newest jobs first, optionally of one collection or status."""
    found = jobs.list_jobs(
        db,
        principal.tenant_id,
        collection=collection,
        status=None if status is None else JobStatus(status),
        limit=limit,
    )
    return JobList(jobs=[job_out(job) for job in found])


@router.post(
    "/{job_id}/retry", status_code=status.HTTP_202_ACCEPTED, responses=error_responses(409)
)
def retry_job(
    job_id: uuid.UUID, principal: Writer, db: DatabaseDep, request: Request, response: Response
) -> JobOut:
    """Queue a failed job again, as new (attempts, counts and errors reset): a worker runs its
    files and texts again, skipping what is already stored. 409 for a job that is not
    `failed`, one `ragservice ingest` ran, or one whose uploads were purged since
    (`RAGSERVICE_JOB_PAYLOAD_RETENTION_HOURS`)."""
    job = job_out(jobs.retry_job(db, principal.tenant_id, job_id))
    wake_workers(request)
    response.headers["Location"] = f"/v1/jobs/{job_id}"
    return job
