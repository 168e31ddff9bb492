"""Sources a collection is kept in sync with: added (checked), listed, shown with their last
run, removed; a run queued for the workers or made now in this process (the CLI).

Who may add what: over the API (`operator=False`) folders are refused, a web host must pass
the SSRF guard, and an S3 bucket must be one `RAGSERVICE_SOURCES_S3_BUCKETS` lists (the
server's AWS credentials are not every tenant's); operators at the command line may add any.
At most one run of a source is queued or running at once (`store.sources`): a second is a
ConflictError, whoever asks. Additions and removals are audited.

As every service, these take the tenant as the caller's: `tenant_id` to read and queue, a
`Caller` (the API's principal, the CLI's `Operator`) to change and be audited, and `Settings`
where the checks need them.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy.orm import Session

from ingest.sources.credentials import Credentials, redact
from ingest.sources.runs import run_source
from ingest.sources.sync import SyncProgress, SyncReport
from ragservice import store
from ragservice.config import Settings
from ragservice.db import Database, tenancy
from ragservice.db.locks import SessionLock
from ragservice.db.models import IngestJob, Source
from ragservice.errors import ConflictError, NotFoundError
from ragservice.runtime import Runtime
from ragservice.services.callers import Caller, audit
from ragservice.services.source_checks import checked_source
from ragservice.types import JobStatus

log = logging.getLogger(__name__)

SourceKind = Literal["web", "s3", "folder"]

HEARTBEAT_SECONDS = 1.0
"""A CLI run records its counts and heartbeat at most this often."""


@dataclass(frozen=True)
class SourceSpec:
    """A source to add: where (`https://…`, `s3://bucket/prefix`, or a folder path, for
    operators only) and how it is read, who may read its documents, how often it runs."""

    location: str
    options: dict[str, Any]
    readers: tuple[str, ...] | None = None
    """Who may read its documents (`ragservice.readers` names); None: the whole tenant."""
    every_seconds: int | None = None
    """None: it runs only when asked."""
    prune: bool = True
    """A run deletes the documents gone from the source."""
    credentials: Credentials | None = None
    """What it is read with, given apart from `location` (else split off it, if it has
    some); kept apart and never shown (`ingest.sources.credentials`)."""


@dataclass(frozen=True)
class SourceRun:
    """A run of a source: its job, with the sync's counts (`SyncReport.counts` keys)."""

    job_id: uuid.UUID
    status: JobStatus
    counts: dict[str, int]
    errors: list[dict[str, str]]
    started_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True)
class SourceView:
    id: uuid.UUID
    collection: str
    kind: SourceKind
    location: str
    options: dict[str, Any]
    readers: tuple[str, ...] | None
    every_seconds: int | None
    prune: bool
    next_run_at: datetime | None
    created_at: datetime
    last_run: SourceRun | None
    has_credentials: bool = False
    """It is read with credentials (which are never shown)."""


# -- added, listed, shown, removed ---------------------------------------------------------


def add_source(
    db: Database,
    settings: Settings,
    caller: Caller,
    collection: str,
    spec: SourceSpec,
    *,
    operator: bool = False,
) -> SourceView:
    """Add a source to the collection (created if missing), checked as the module says:
    InvalidInputError for a location or option refused, ConflictError when the collection
    has a source there already or has `RAGSERVICE_SOURCES_MAX_PER_COLLECTION`. No run is
    queued (`queue_run`)."""
    checked = checked_source(settings, spec, operator=operator)
    limit = settings.sources.max_per_collection
    with db.write() as session:
        cid = store.collections.ensure_collection(session, caller.tenant_id, collection)
        if store.sources.find_source(session, cid, checked.location) is not None:
            raise ConflictError(
                f"collection {collection!r} already has a source at {checked.location!r}"
            )
        if store.sources.count_sources(session, cid) >= limit:
            raise ConflictError(
                f"collection {collection!r} has {limit} sources, the most it may have "
                "(RAGSERVICE_SOURCES_MAX_PER_COLLECTION)"
            )
        source = store.sources.add_source(
            session,
            store.sources.NewSource(
                tenant_id=caller.tenant_id,
                collection_id=cid,
                kind=checked.kind,
                location=checked.location,
                options=checked.options,
                readers=checked.readers,
                every_seconds=spec.every_seconds,
                prune=spec.prune,
                credentials=_stored(checked.credentials),
            ),
        )
        details = {"source": str(source.id), "location": source.location, "kind": source.kind}
        audit(
            session,
            caller,
            "source.add",
            collection,
            {**details, "credentials": checked.credentials is not None},
        )
        return _view(session, source, collection)


def find_or_add_source(
    db: Database,
    settings: Settings,
    caller: Caller,
    collection: str,
    spec: SourceSpec,
    *,
    operator: bool = True,
) -> SourceView:
    """The collection's source at `spec.location` (as it is stored: `spec` does not change
    it, except for credentials given anew, which replace its own), or a new one added as
    `add_source` does (`ragservice ingest URL`, `sync PATH`)."""
    checked = checked_source(settings, spec, operator=operator)
    with db.read() as session:
        cid = store.collections.find_collection_id(session, caller.tenant_id, collection)
        found = None if cid is None else store.sources.find_source(session, cid, checked.location)
        if found is not None and not _new_credentials(found, checked.credentials):
            return _view(session, found, collection)
    if found is not None:
        with db.write() as session:
            store.sources.set_credentials(session, found.id, _stored(checked.credentials))
            details = {"source": str(found.id), "location": found.location}
            audit(session, caller, "source.credentials", collection, details)
            return _view(
                session, _require(session, caller.tenant_id, collection, found.id), collection
            )
    try:
        return add_source(db, settings, caller, collection, spec, operator=operator)
    except ConflictError:  # added meanwhile by another command
        with db.read() as session:
            cid = store.collections.require_collection_id(session, caller.tenant_id, collection)
            found = store.sources.find_source(session, cid, checked.location)
            if found is None:
                raise
            return _view(session, found, collection)


def list_sources(db: Database, tenant_id: uuid.UUID, collection: str) -> list[SourceView]:
    """The collection's sources, oldest first, each with its last run."""
    with db.read() as session:
        cid = store.collections.require_collection_id(session, tenant_id, collection)
        found = store.sources.list_sources(session, cid)
        runs = store.sources.last_runs(session, [s.id for s in found])
        return [_as_view(s, collection, runs.get(s.id)) for s in found]


def get_source(
    db: Database, tenant_id: uuid.UUID, collection: str, source_id: uuid.UUID
) -> SourceView:
    """The collection's source with its last run; NotFoundError for another's, as for none."""
    with db.read() as session:
        return _view(session, _require(session, tenant_id, collection, source_id), collection)


def remove_source(
    db: Database,
    caller: Caller,
    collection: str,
    source_id: uuid.UUID,
    *,
    delete_documents: bool = False,
) -> None:
    """Remove the source (its runs' jobs stay, naming none); with `delete_documents`, the
    documents it brought go too (with their chunks and the cached answers built on them),
    else they stay as any uploaded document would. A queued run then fails (its source is
    gone); one going on fails at its next save."""
    with db.write() as session:
        source = _require(session, caller.tenant_id, collection, source_id)
        deleted: list[str] = []
        if delete_documents:
            keys = store.sources.known_keys(session, source.id)
            deleted = store.sources.delete_source_documents(session, source.collection_id, keys)
        store.sources.delete_source(session, source.id)
        audit(
            session,
            caller,
            "source.remove",
            collection,
            {"source": str(source_id), "location": source.location, "documents": len(deleted)},
        )


# -- runs ------------------------------------------------------------------------------------


def queue_run(
    db: Database, tenant_id: uuid.UUID, collection: str, source_id: uuid.UUID
) -> uuid.UUID:
    """Queue a run for the workers; its job's id. ConflictError while a run of the source
    is queued or running. The caller wakes its workers."""
    with db.write() as session:
        source = _require(session, tenant_id, collection, source_id)
        job_id = store.sources.queue_run(session, source)
        if job_id is None:
            raise _running(session, source)
        return job_id


def run_now(
    runtime: Runtime,
    tenant_id: uuid.UUID,
    collection: str,
    source_id: uuid.UUID,
    *,
    progress: SyncProgress | None = None,
) -> SyncReport:
    """Run the source now in this thread (the CLI), recorded as a job like a worker's run and
    under the same guard: ConflictError while another run is queued or running. The job's
    claim is tied to an advisory lock of this process, so that a killed command does not
    block its source (the next run marks the dead one failed). Ctrl-C stops it between
    documents, deleting nothing; the next run finishes what it did not."""
    db = runtime.db
    with tenancy.as_tenant(tenant_id):
        with db.read() as session:
            source = _require(session, tenant_id, collection, source_id)
        with SessionLock(db.url) as claim:
            worker = f"cli:{socket.gethostname()}:{os.getpid()}"
            with db.write() as session:
                job_id = store.sources.start_cli_run(
                    session, source, worker=worker, claim_key=claim.key
                )
                if job_id is None:
                    raise _running(session, source)
            return _run_recorded(runtime, source, job_id, worker, progress)


def _run_recorded(
    runtime: Runtime,
    source: Source,
    job_id: uuid.UUID,
    worker: str,
    progress: SyncProgress | None,
) -> SyncReport:
    report = SyncReport()
    beat = _Heartbeat(runtime.db, job_id, worker, progress)
    try:
        run_source(runtime, source, progress=beat, report=report)
    except BaseException as exc:
        credentials = Credentials.from_json(source.credentials)
        stopped = isinstance(exc, KeyboardInterrupt)
        error = "stopped before its end" if stopped else redact(str(exc), credentials)
        _finish(runtime.db, job_id, worker, JobStatus.FAILED, report, error or type(exc).__name__)
        raise
    _finish(
        runtime.db, job_id, worker, JobStatus.FAILED if report.failure else JobStatus.DONE, report
    )
    return report


class _Heartbeat:
    """A CLI run's progress: the caller's callback, and the job's counts and heartbeat at
    most once a second."""

    def __init__(
        self, db: Database, job_id: uuid.UUID, worker: str, progress: SyncProgress | None
    ) -> None:
        self._db = db
        self._job_id = job_id
        self._worker = worker
        self._progress = progress
        self._last = time.monotonic()

    def __call__(self, report: SyncReport) -> None:
        if self._progress is not None:
            self._progress(report)
        now = time.monotonic()
        if now - self._last >= HEARTBEAT_SECONDS:
            self._last = now
            with self._db.write() as session:
                store.jobs.heartbeat_job(
                    session, self._job_id, self._worker, counts=report.counts()
                )


def _finish(
    db: Database,
    job_id: uuid.UUID,
    worker: str,
    status: JobStatus,
    report: SyncReport,
    error: str | None = None,
) -> None:
    errors = report.job_errors()
    if error:
        errors.insert(0, {"error": error})
    with db.write() as session:
        store.jobs.finish_job(
            session,
            job_id,
            status=status,
            counts=report.counts(),
            errors=errors,
            worker=worker,
            restricted=report.restricted,
        )


# -- helpers -----------------------------------------------------------------------------------


def _require(
    session: Session, tenant_id: uuid.UUID, collection: str, source_id: uuid.UUID
) -> Source:
    cid = store.collections.require_collection_id(session, tenant_id, collection)
    source = store.sources.get_source(session, cid, source_id)
    if source is None:
        raise NotFoundError(f"source {source_id} not found in collection {collection!r}")
    return source


def _running(session: Session, source: Source) -> ConflictError:
    active = store.sources.active_run(session, source.id)
    which = f" (job {active})" if active is not None else ""
    return ConflictError(f"a run of source {source.id} is queued or running{which}")


def _stored(credentials: Credentials | None) -> dict[str, str] | None:
    return None if credentials is None else credentials.as_json()


def _new_credentials(source: Source, given: Credentials | None) -> bool:
    """Whether `given` are credentials other than the source's own."""
    return given is not None and given != Credentials.from_json(source.credentials)


def _view(session: Session, source: Source, collection: str) -> SourceView:
    runs = store.sources.last_runs(session, [source.id])
    return _as_view(source, collection, runs.get(source.id))


def _as_view(source: Source, collection: str, job: IngestJob | None) -> SourceView:
    kind: SourceKind = "web" if source.kind == "web" else "s3" if source.kind == "s3" else "folder"
    return SourceView(
        id=source.id,
        collection=collection,
        kind=kind,
        location=source.location,
        options=dict(source.options),
        readers=None if source.readers is None else tuple(source.readers),
        every_seconds=source.every_seconds,
        prune=source.prune,
        next_run_at=source.next_run_at,
        created_at=source.created_at,
        last_run=None if job is None else _run_view(job),
        has_credentials=source.credentials is not None,
    )


def _run_view(job: IngestJob) -> SourceRun:
    return SourceRun(
        job_id=job.id,
        status=JobStatus(job.status),
        counts={k: int(v) for k, v in (job.counts or {}).items()},
        errors=[{k: str(v) for k, v in e.items()} for e in job.errors or []],
        started_at=job.started_at,
        finished_at=job.finished_at,
    )
