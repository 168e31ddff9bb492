"""Ingest jobs: a tenant's jobs listed, one shown, a failed one queued again; and the same for
an operator, over every tenant, with the names of each job's tenant and collection. The REST
API's `/v1/jobs` and `ragservice jobs` both show a job as `JobView.to_json()` does."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter
from sqlalchemy.orm import Session

from ragservice import store
from ragservice.db import Database
from ragservice.db.models import IngestJob
from ragservice.errors import NotFoundError
from ragservice.types import JobStatus


@dataclass(frozen=True)
class JobError:
    source: str | None
    """The file or row; None for an error of the whole job."""
    error: str


@dataclass(frozen=True)
class JobView:
    """A job's status, counts and per-file errors."""

    id: uuid.UUID
    status: JobStatus
    kind: str
    collection_id: uuid.UUID | None
    counts: dict[str, int]
    errors: list[JobError]
    attempts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        """The job as JSON values, in the API's field order and formats."""
        json: dict[str, Any] = _VIEW_JSON.dump_python(self, mode="json")
        return json


_VIEW_JSON = TypeAdapter(JobView)


@dataclass(frozen=True)
class PlacedJob:
    """A job with the names of its tenant and collection (None: it has none), for operators."""

    job: JobView
    tenant: str
    collection: str | None

    def to_json(self) -> dict[str, Any]:
        return {**self.job.to_json(), "tenant": self.tenant, "collection": self.collection}


def job_view(job: IngestJob) -> JobView:
    return JobView(
        id=job.id,
        status=JobStatus(job.status),
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


# -- a tenant's jobs -----------------------------------------------------------------------


def get_job(db: Database, tenant_id: uuid.UUID, job_id: uuid.UUID) -> JobView:
    """The tenant's job; NotFoundError for another tenant's, as for a missing one."""
    with db.read() as session:
        return job_view(_require(session, tenant_id, job_id))


def list_jobs(
    db: Database,
    tenant_id: uuid.UUID,
    *,
    collection: str | None = None,
    status: JobStatus | None = None,
    limit: int = 50,
) -> list[JobView]:
    """The tenant's newest jobs first, optionally of one of its collections (NotFoundError
    for a name it does not have) or in one status."""
    with db.read() as session:
        cid = None
        if collection is not None:
            cid = store.collections.require_collection_id(session, tenant_id, collection)
        jobs = store.jobs.list_jobs(
            session, tenant_id, collection_id=cid, status=status, limit=limit
        )
        return [job_view(job) for job in jobs]


def retry_job(db: Database, tenant_id: uuid.UUID, job_id: uuid.UUID) -> JobView:
    """Queue the tenant's failed job again, as new (see `store.jobs.retry_job`): NotFoundError
    or ConflictError otherwise. The caller wakes its workers."""
    with db.write() as session:
        return job_view(store.jobs.retry_job(session, tenant_id, job_id))


# -- an operator's jobs (every tenant's, or one's) -----------------------------------------


def list_placed_jobs(
    db: Database,
    tenant_id: uuid.UUID | None,
    *,
    collection: str | None = None,
    status: JobStatus | None = None,
    limit: int = 50,
) -> list[PlacedJob]:
    """The newest jobs first, of every tenant (None) or one; `collection`: of the collections
    with that name, one per tenant."""
    with db.read() as session:
        jobs = store.jobs.list_jobs(
            session, tenant_id, collection=collection, status=status, limit=limit
        )
        return _placed(session, jobs)


def get_placed_job(db: Database, tenant_id: uuid.UUID | None, job_id: uuid.UUID) -> PlacedJob:
    """The job of any tenant (None) or of one; NotFoundError otherwise."""
    with db.read() as session:
        return _placed(session, [_require(session, tenant_id, job_id)])[0]


def retry_placed_job(db: Database, tenant_id: uuid.UUID | None, job_id: uuid.UUID) -> PlacedJob:
    """`retry_job` for a job of any tenant (None) or of one."""
    with db.write() as session:
        return _placed(session, [store.jobs.retry_job(session, tenant_id, job_id)])[0]


def _require(session: Session, tenant_id: uuid.UUID | None, job_id: uuid.UUID) -> IngestJob:
    job = store.jobs.get_job(session, tenant_id, job_id)
    if job is None:
        raise NotFoundError(f"job {job_id} not found")
    return job


def _placed(session: Session, jobs: list[IngestJob]) -> list[PlacedJob]:
    places = store.jobs.job_places(session, [job.id for job in jobs])
    return [PlacedJob(job_view(job), *places[job.id]) for job in jobs]
