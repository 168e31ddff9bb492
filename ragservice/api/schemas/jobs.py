"""Ingest jobs: an upload's status, counts and per-file errors."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from ragservice.services.jobs import JobView

JobStatus = Literal["queued", "running", "done", "failed"]


class JobError(BaseModel):
    source: str | None = Field(description="the file or row; null for an error of the whole job")
    error: str


class JobOut(BaseModel):
    id: uuid.UUID
    status: str
    kind: str
    collection_id: uuid.UUID | None
    counts: dict[str, int]
    errors: list[JobError]
    attempts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class JobList(BaseModel):
    jobs: list[JobOut]


def job_out(job: JobView) -> JobOut:
    return JobOut(
        id=job.id,
        status=job.status,
        kind=job.kind,
        collection_id=job.collection_id,
        counts=job.counts,
        errors=[JobError(source=e.source, error=e.error) for e in job.errors],
        attempts=job.attempts,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
    )
