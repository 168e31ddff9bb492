"""Sources: a web site or an S3 bucket a collection is kept in sync with, and its runs."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, StringConstraints

from ingest.sources.credentials import Credentials
from ragservice.api.schemas.common import JsonObject, Storable
from ragservice.api.schemas.documents import Readers
from ragservice.services.source_checks import (
    MAX_CREDENTIAL_CHARS,
    MAX_LOCATION_CHARS,
    MIN_EVERY_SECONDS,
)
from ragservice.services.sources import SourceRun, SourceView


class SourceCredentials(BaseModel):
    """What a source is read with: HTTP Basic for a web site, an access key id and secret
    key for S3. Write-only: no answer shows them."""

    model_config = ConfigDict(extra="forbid")

    username: Annotated[str, StringConstraints(max_length=MAX_CREDENTIAL_CHARS), Storable] = Field(
        default="", description="the user name (S3: the access key id)"
    )
    password: SecretStr = Field(
        default=SecretStr(""),
        max_length=MAX_CREDENTIAL_CHARS,
        description="the password (S3: the secret access key)",
    )

    def value(self) -> Credentials:
        return Credentials(self.username, self.password.get_secret_value())


class SourceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    location: Annotated[
        str, StringConstraints(min_length=1, max_length=MAX_LOCATION_CHARS), Storable
    ] = Field(
        description="an http(s) URL (a site, crawled from there) or s3://bucket/prefix (a "
        "bucket RAGSERVICE_SOURCES_S3_BUCKETS lists). Credentials in it (`https://user:pass@"
        "host/`) are split off, as if given in `credentials`; the location is kept without them",
        examples=["https://docs.example.com/"],
    )
    options: JsonObject = Field(
        default_factory=dict,
        description="the reader's options: web `depth`, `max_pages`, `include`, `exclude` "
        "(URL patterns); S3 `include`, `exclude`, `endpoint_url`, `region`",
    )
    credentials: SourceCredentials | None = Field(
        default=None,
        description="what the source is read with, if not in the location; never shown again",
    )
    readers: Readers = None
    every_seconds: int | None = Field(
        default=None,
        ge=MIN_EVERY_SECONDS,
        description="run every so many seconds; null: only when asked (`POST …/run`)",
    )
    prune: bool = Field(
        default=True, description="a run deletes the documents gone from the source"
    )
    run: bool = Field(default=True, description="queue a first run now")


class SourceRunOut(BaseModel):
    job_id: uuid.UUID = Field(description="the run's job (`GET /v1/jobs/{id}`)")
    status: str
    counts: dict[str, int] = Field(
        description="found, added, changed, unchanged, removed, failed, skipped (files of a "
        "type no loader reads), requests, not_modified"
    )
    errors: list[dict[str, str]] = Field(
        description="`source` (a document's key) and `error`; an error of the whole run has "
        "no `source`"
    )
    started_at: datetime | None
    finished_at: datetime | None


class SourceOut(BaseModel):
    id: uuid.UUID
    collection: str
    kind: Literal["web", "s3", "folder"]
    location: str
    options: dict[str, object]
    readers: list[str] | None
    every_seconds: int | None
    prune: bool
    has_credentials: bool = Field(
        default=False, description="it is read with credentials (which are never shown)"
    )
    next_run_at: datetime | None = Field(description="when the schedule queues the next run")
    created_at: datetime
    last_run: SourceRunOut | None
    queued_job_id: uuid.UUID | None = Field(
        default=None, description="the run this request queued, if any"
    )


class SourceList(BaseModel):
    sources: list[SourceOut]


class RunQueued(BaseModel):
    job_id: uuid.UUID


def run_out(run: SourceRun) -> SourceRunOut:
    return SourceRunOut(
        job_id=run.job_id,
        status=run.status,
        counts=run.counts,
        errors=run.errors,
        started_at=run.started_at,
        finished_at=run.finished_at,
    )


def source_out(view: SourceView, queued: uuid.UUID | None = None) -> SourceOut:
    return SourceOut(
        id=view.id,
        collection=view.collection,
        kind=view.kind,
        location=view.location,
        options=view.options,
        readers=None if view.readers is None else list(view.readers),
        every_seconds=view.every_seconds,
        prune=view.prune,
        has_credentials=view.has_credentials,
        next_run_at=view.next_run_at,
        created_at=view.created_at,
        last_run=None if view.last_run is None else run_out(view.last_run),
        queued_job_id=queued,
    )
