"""Ingest jobs: an upload's status, counts and per-file errors."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from ragservice.services.jobs import JobView
from ragservice.types import JobStatus

if TYPE_CHECKING:
    JobStatusParameter = JobStatus
else:  # its values inline in the OpenAPI document, and a 422 that lists them, as a Literal's
    JobStatusParameter = Literal[tuple(s.value for s in JobStatus)]
"""A job status as a query parameter takes it (a plain string: `JobStatus(...)` makes it one)."""


class JobError(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    source: str | None = Field(description="the file or row; null for an error of the whole job")
    error: str


class JobOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

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
    """The job as the API shows it: `JobView`'s fields, as they are."""
    return JobOut.model_validate(job)
