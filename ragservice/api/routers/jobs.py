"""Ingest jobs: status, counts and per-file errors of uploads."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query

from ragservice import store
from ragservice.api.deps import Reader, RuntimeDep, collection_id
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
