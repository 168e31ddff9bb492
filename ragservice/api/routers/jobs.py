"""Ingest jobs: status, counts and per-file errors of uploads, and queuing a failed one again."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status

from ragservice import store
from ragservice.api.deps import Reader, RuntimeDep, Writer, collection_id, wake_workers
from ragservice.api.schemas.common import error_responses
from ragservice.api.schemas.jobs import JobList, JobOut, JobStatus, job_out
from ragservice.errors import NotFoundError

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=error_responses())


@router.get("/{job_id}")
def get_job(job_id: uuid.UUID, principal: Reader, runtime: RuntimeDep) -> JobOut:
    """A job's status (queued, running, done, failed), counts and per-file errors."""
    with runtime.db.read() as session:
        job = store.jobs.get_job(session, principal.tenant_id, job_id)
    if job is None:
        raise NotFoundError(f"job {job_id} not found")
    return job_out(job)


@router.get("")
def list_jobs(
    principal: Reader,
    runtime: RuntimeDep,
    collection: str | None = None,
    status: JobStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> JobList:
    """The newest jobs first, optionally of one collection or status."""
    cid = None if collection is None else collection_id(runtime, principal.tenant_id, collection)
    with runtime.db.read() as session:
        jobs = store.jobs.list_jobs(
            session, principal.tenant_id, collection_id=cid, status=status, limit=limit
        )
    return JobList(jobs=[job_out(job) for job in jobs])


@router.post(
    "/{job_id}/retry", status_code=status.HTTP_202_ACCEPTED, responses=error_responses(409)
)
def retry_job(
    job_id: uuid.UUID, principal: Writer, runtime: RuntimeDep, request: Request, response: Response
) -> JobOut:
    """Queue a failed job again, as new (attempts, counts and errors reset): a worker runs its
    files and texts again, skipping what is already stored. 409 for a job that is not
    `failed`, one `ragservice ingest` ran, or one whose uploads were purged since
    (`RAGSERVICE_JOB_PAYLOAD_RETENTION_HOURS`)."""
    with runtime.db.write() as session:
        job = job_out(store.jobs.retry_job(session, principal.tenant_id, job_id))
    wake_workers(request)
    response.headers["Location"] = f"/v1/jobs/{job_id}"
    return job
