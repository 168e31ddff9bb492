"""Ingest jobs: status, counts and per-file errors of uploads."""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, Query

from ragservice import store
from ragservice.api.deps import Reader, RuntimeDep, collection_id
from ragservice.api.schemas import JobError, JobList, JobOut, error_responses
from ragservice.db.models import IngestJob
from ragservice.errors import NotFoundError

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=error_responses())

JobStatus = Literal["queued", "running", "done", "failed"]


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


def job_out(job: IngestJob) -> JobOut:
    return JobOut(
        id=job.id,
        status=job.status,
        kind=job.kind,
        collection_id=job.collection_id,
        counts={k: int(v) for k, v in (job.counts or {}).items()},
        errors=[
            JobError(source=e.get("source"), error=str(e.get("error", "")))
            for e in job.errors or []
        ],
        attempts=job.attempts,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
    )
