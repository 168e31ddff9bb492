"""The ingest job queue: enqueue, claim (SKIP LOCKED), heartbeat, release, finish."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
from sqlalchemy import (
    ColumnElement,
    ScalarSelect,
    and_,
    delete,
    func,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.orm import Session, aliased

from ragservice.db import locks, tenancy
from ragservice.db.engine import driver_connection
from ragservice.db.models import Collection, IngestJob, IngestJobItem, Tenant
from ragservice.db.scope import current_asker
from ragservice.errors import ConflictError, NotFoundError
from ragservice.store import bulk
from ragservice.types import FINISHED_JOB_STATUSES, JobStatus

log = logging.getLogger(__name__)


CLI_JOB_KIND = "cli"
"""Jobs the ingest CLI runs in-process; workers never claim them."""

_ITEM_COLUMNS = (
    "job_id",
    "tenant_id",
    "ordinal",
    "kind",
    "name",
    "title",
    "body",
    "metadata",
    "readers",
)
_ITEM_TYPES = ("uuid", "uuid", "int4", "text", "text", "text", "bytea", "jsonb", "text[]")


@dataclass(frozen=True, slots=True)
class JobItem:
    """One input of a queued job.

    A `file` item carries the uploaded file's name and bytes; a `text` item carries the
    document's external id in `name`, its title, and its UTF-8 text in `body`.
    """

    kind: str
    name: str
    title: str | None
    body: bytes
    metadata: dict[str, Any] = field(default_factory=dict)
    readers: tuple[str, ...] | None = None
    """Who may read its documents (None: not said; see `LoadedDocument.readers`)."""


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job a worker has just claimed; `collection` is None when the collection is gone."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    collection_id: uuid.UUID | None
    collection: str | None
    kind: str
    params: dict[str, Any]
    attempts: int
    worker: str
    writes_as: frozenset[str] | None = None
    """Whose documents it may replace: its queuer's principal set (None: every document)."""


def start_job(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    collection_id: uuid.UUID,
    kind: str,
    params: dict[str, Any],
    worker: str,
    restricted: bool = False,
) -> uuid.UUID:
    """Record a job that starts running now (the CLI runs its own jobs in-process)."""
    job = IngestJob(
        tenant_id=tenant_id,
        collection_id=collection_id,
        kind=kind,
        status=JobStatus.RUNNING,
        params=params,
        worker=worker,
        asker=current_asker(),
        restricted=restricted,
        attempts=1,
        started_at=func.now(),
        heartbeat_at=func.now(),
    )
    session.add(job)
    session.flush()
    return job.id


def enqueue_job(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    collection_id: uuid.UUID,
    kind: str,
    params: dict[str, Any],
    items: Sequence[JobItem],
) -> uuid.UUID:
    """Queue a job with its items (one COPY); workers see it once the transaction commits.
    A job whose items name readers is restricted: shown to its asker and to those who read
    every document only."""
    job = IngestJob(
        tenant_id=tenant_id,
        collection_id=collection_id,
        kind=kind,
        status=JobStatus.QUEUED,
        params=params,
        asker=current_asker(),
        restricted=any(item.readers or _rows_name_readers(item) for item in items),
        writes_as=tenancy.asker_principals(),
    )
    session.add(job)
    session.flush()
    rows = [_item_row(job.id, tenant_id, ordinal, item) for ordinal, item in enumerate(items)]
    bulk.insert_rows(
        driver_connection(session), "ingest_job_items", _ITEM_COLUMNS, _ITEM_TYPES, rows
    )
    return job.id


_ROW_FILES = (".jsonl", ".parquet")


def _rows_name_readers(item: JobItem) -> bool:
    """A file whose rows may name their own readers: its job is shown as a restricted one from
    the start (its rows' readers are known only once it runs, and only if they are written)."""
    return item.kind == "file" and item.name.lower().endswith(_ROW_FILES)


def _item_row(
    job_id: uuid.UUID, tenant_id: uuid.UUID, ordinal: int, item: JobItem
) -> tuple[Any, ...]:
    metadata = psycopg.types.json.Jsonb(item.metadata)
    readers = None if item.readers is None else list(item.readers)
    return (
        job_id,
        tenant_id,
        ordinal,
        item.kind,
        item.name,
        item.title,
        item.body,
        metadata,
        readers,
    )


def claim_job(
    session: Session,
    *,
    worker: str,
    stale_after_seconds: float,
    max_attempts: int,
    hold: Callable[[], int] | None = None,
) -> ClaimedJob | None:
    """Claim a job that is queued, or running but abandoned (its worker died): the advisory
    lock its claim recorded is free, or it sent no heartbeat for `stale_after_seconds`.
    Attempts goes up by one and `worker` owns it.

    Tenants share the workers: the job claimed is one of the tenant with the fewest jobs
    running, then the oldest. An abandoned job counts as running (its tenant's own), so
    taking it over waits behind the queued jobs of tenants with fewer running, and one
    tenant's long runs cannot keep another's uploads waiting while workers free up.

    `hold`, called once a job is found (its row still locked by this transaction), takes the
    advisory lock the new claim is tied to and returns its key (`db.locks.SessionLock`);
    without it the claim is taken over only once its heartbeat is stale.

    Abandoned jobs that already used `max_attempts` are marked failed instead. SKIP LOCKED lets
    any number of workers claim at once: each gets a different job, or none, without waiting.
    """
    stale = _stale_jobs(stale_after_seconds)
    abandoned = and_(IngestJob.status == JobStatus.RUNNING, or_(stale, _claim_gone()))
    _fail_exhausted(session, abandoned, stale, max_attempts)
    job_id = session.scalar(
        select(IngestJob.id)
        .where(
            IngestJob.kind != CLI_JOB_KIND,
            or_(
                IngestJob.status == JobStatus.QUEUED,
                and_(abandoned, IngestJob.attempts < max_attempts),
            ),
        )
        .order_by(_running_of_tenant(), IngestJob.created_at)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    if job_id is None:
        return None
    job = session.execute(
        update(IngestJob)
        .where(IngestJob.id == job_id)
        .values(
            status=JobStatus.RUNNING,
            attempts=IngestJob.attempts + 1,
            worker=worker,
            claim_key=None if hold is None else hold(),
            heartbeat_at=func.now(),
            started_at=func.now(),
        )
        .returning(IngestJob)
    ).scalar_one()
    return _claimed(session, job)


def others_waiting(session: Session, tenant_id: uuid.UUID) -> bool:
    """Whether a job of another tenant than `tenant_id` is queued for the workers (for a
    session that sees every tenant's jobs)."""
    waiting = select(IngestJob.id).where(
        IngestJob.status == JobStatus.QUEUED,
        IngestJob.kind != CLI_JOB_KIND,
        IngestJob.tenant_id != tenant_id,
    )
    return bool(session.scalar(select(waiting.exists())))


QUEUE_COUNT_TIMEOUT_MS = 2000
"""`queue_depth` gives up after this long (a scrape must not hang on a busy database)."""


def queue_depth(session: Session) -> tuple[int, int]:
    """Jobs queued for workers (every tenant's, for a session that sees them all) and their
    items; CLI jobs never wait in the queue. One count, bounded by `QUEUE_COUNT_TIMEOUT_MS`."""
    session.execute(text(f"SET LOCAL statement_timeout = {QUEUE_COUNT_TIMEOUT_MS}"))
    queued = (
        select(IngestJob.id)
        .where(IngestJob.status == JobStatus.QUEUED, IngestJob.kind != CLI_JOB_KIND)
        .subquery()
    )
    items = (
        select(func.count())
        .select_from(IngestJobItem)
        .where(IngestJobItem.job_id == queued.c.id)
        .scalar_subquery()
    )
    jobs, total = session.execute(
        select(func.count(), func.coalesce(func.sum(items), 0)).select_from(queued)
    ).one()
    return int(jobs), int(total)


def _stale_jobs(stale_after_seconds: float) -> ColumnElement[bool]:
    cutoff = func.now() - timedelta(seconds=stale_after_seconds)
    return and_(IngestJob.status == JobStatus.RUNNING, IngestJob.heartbeat_at < cutoff)


def _running_of_tenant() -> ScalarSelect[Any]:
    """The number of running jobs (abandoned ones included) of the job's tenant."""
    running = aliased(IngestJob)
    return (
        select(func.count())
        .select_from(running)
        .where(running.tenant_id == IngestJob.tenant_id, running.status == JobStatus.RUNNING)
        .scalar_subquery()
    )


def _claim_gone() -> ColumnElement[bool]:
    """The job's claim was tied to a database session that has ended (db/locks.py)."""
    return and_(IngestJob.claim_key.is_not(None), ~locks.lock_held(IngestJob.claim_key))


def _fail_exhausted(
    session: Session,
    abandoned: ColumnElement[bool],
    stale: ColumnElement[bool],
    max_attempts: int,
) -> None:
    exhausted = session.execute(
        select(IngestJob.id, IngestJob.attempts, IngestJob.worker, stale)
        .where(IngestJob.kind != CLI_JOB_KIND, abandoned, IngestJob.attempts >= max_attempts)
        .with_for_update(skip_locked=True)
    ).all()
    for job_id, attempts, worker, was_stale in exhausted:
        why = "stopped sending heartbeats" if was_stale else "ended (its database session closed)"
        error = f"gave up after {attempts} attempts: worker {worker} {why}"
        log.warning("job %s failed: %s", job_id, error)
        session.execute(
            update(IngestJob)
            .where(IngestJob.id == job_id)
            .values(
                status=JobStatus.FAILED,
                finished_at=func.now(),
                errors=[{"error": error}],
                claim_key=None,
            )
        )


def _claimed(session: Session, job: IngestJob) -> ClaimedJob:
    collection = session.scalar(
        select(Collection.name).where(
            Collection.id == job.collection_id, Collection.tenant_id == job.tenant_id
        )
    )
    assert job.worker is not None
    return ClaimedJob(
        id=job.id,
        tenant_id=job.tenant_id,
        collection_id=job.collection_id,
        collection=collection,
        kind=job.kind,
        params=job.params,
        attempts=job.attempts,
        worker=job.worker,
        writes_as=None if job.writes_as is None else frozenset(job.writes_as),
    )


def heartbeat_job(
    session: Session, job_id: uuid.UUID, worker: str, *, counts: dict[str, int] | None = None
) -> bool:
    """Mark `worker`'s running job alive, recording `counts` if given.

    False when the job is no longer this worker's: another worker took it over after the
    heartbeats stopped, or the job is gone (its collection was deleted).
    """
    values: dict[str, Any] = {"heartbeat_at": func.now()}
    if counts is not None:
        values["counts"] = counts
    stmt = update(IngestJob).where(_owned_by(job_id, worker)).values(**values)
    return session.scalar(stmt.returning(IngestJob.id)) is not None


def release_job(session: Session, job_id: uuid.UUID, worker: str) -> bool:
    """Put a job its worker stopped before finishing back in the queue; the interrupted
    attempt does not count. False when the job was no longer this worker's."""
    stmt = (
        update(IngestJob)
        .where(_owned_by(job_id, worker))
        .values(
            status=JobStatus.QUEUED,
            worker=None,
            claim_key=None,
            heartbeat_at=None,
            attempts=func.greatest(IngestJob.attempts - 1, 0),
        )
        .returning(IngestJob.id)
    )
    return session.scalar(stmt) is not None


def _owned_by(job_id: uuid.UUID, worker: str) -> ColumnElement[bool]:
    return and_(
        IngestJob.id == job_id, IngestJob.worker == worker, IngestJob.status == JobStatus.RUNNING
    )


def job_items(session: Session, job_id: uuid.UUID) -> Iterator[JobItem]:
    """The job's items in order, fetched one at a time from a server-side cursor (a body may
    be tens of MB); iterate while the session is open."""
    stmt = (
        select(
            IngestJobItem.kind,
            IngestJobItem.name,
            IngestJobItem.title,
            IngestJobItem.body,
            IngestJobItem.metadata_,
            IngestJobItem.readers,
        )
        .where(IngestJobItem.job_id == job_id)
        .order_by(IngestJobItem.ordinal)
        .execution_options(yield_per=1)
    )
    for kind, name, title, body, metadata, readers in session.execute(stmt):
        yield JobItem(
            kind=kind,
            name=name,
            title=title,
            body=bytes(body),
            metadata=metadata,
            readers=None if readers is None else tuple(readers),
        )


def finish_job(
    session: Session,
    job_id: uuid.UUID,
    *,
    status: JobStatus,
    counts: dict[str, int],
    errors: list[dict[str, str]],
    worker: str | None = None,
    restricted: bool = False,
) -> bool:
    """Record how a job ended. With `worker`, only while that worker still owns the job.
    `restricted`: it wrote a document that has readers (the job is restricted from then on).

    A job that is done drops its items (the uploaded files and texts) at once; a failed job
    keeps them until `purge_job_payloads` drops them, so an operator can queue it again
    meanwhile. False when nothing was updated.
    """
    stmt = update(IngestJob).where(IngestJob.id == job_id)
    if worker is not None:
        stmt = stmt.where(_owned_by(job_id, worker))
    stmt = stmt.values(
        status=status,
        counts=counts,
        errors=errors,
        finished_at=func.now(),
        claim_key=None,
        restricted=IngestJob.restricted | restricted,
    )
    finished = session.scalar(stmt.returning(IngestJob.id)) is not None
    if finished and status == JobStatus.DONE:
        session.execute(delete(IngestJobItem).where(IngestJobItem.job_id == job_id))
    return finished


def purge_job_payloads(session: Session, *, older_than: timedelta) -> int:
    """Drop the items of jobs that ended (done or failed, a worker gave up included) more than
    `older_than` ago; returns how many items went. Queued and running jobs keep theirs."""
    ended = select(IngestJob.id).where(
        IngestJob.status.in_(FINISHED_JOB_STATUSES),
        IngestJob.finished_at < func.now() - older_than,
    )
    stmt = delete(IngestJobItem).where(IngestJobItem.job_id.in_(ended))
    return int(session.execute(stmt).rowcount)  # type: ignore[attr-defined]


def get_job(session: Session, tenant_id: uuid.UUID | None, job_id: uuid.UUID) -> IngestJob | None:
    """The tenant's job `job_id`; None for another tenant's job, as for a missing one.
    `tenant_id` None: any tenant's job (for operators, whose transactions see every tenant)."""
    stmt = select(IngestJob).where(IngestJob.id == job_id)
    if tenant_id is not None:
        stmt = stmt.where(IngestJob.tenant_id == tenant_id)
    return session.scalar(stmt)


def retry_job(session: Session, tenant_id: uuid.UUID | None, job_id: uuid.UUID) -> IngestJob:
    """Queue a failed job again, as if new: no attempts, counts or errors, no worker; a worker
    then claims it like any queued job and runs its items (kept a while after a failure, see
    `finish_job`) again, skipping what an earlier attempt stored.

    NotFoundError for a job that is not the tenant's (`tenant_id` None: any tenant's);
    ConflictError for a job that did not fail, one the CLI ran (workers never take those), one
    whose collection is gone, a source's run (the source is run again instead), or one whose
    items were purged."""
    job = session.scalar(
        select(IngestJob).where(IngestJob.id == job_id, *_of_tenant(tenant_id)).with_for_update()
    )
    if job is None:
        raise NotFoundError(f"job {job_id} not found")
    if job.status != JobStatus.FAILED:
        raise ConflictError(f"job {job_id} is {job.status}; only a failed job can be retried")
    if job.kind == CLI_JOB_KIND:
        raise ConflictError(
            f"job {job_id} was run by `ragservice ingest`, not by a worker; run that command "
            "again (it skips what is already stored)"
        )
    if job.collection_id is None:
        raise ConflictError(f"job {job_id} has no collection any more; it cannot run")
    if job.params.get("source_id"):  # a source's run: its source is run again instead
        raise ConflictError(
            f"job {job_id} was a run of a source; queue a new run of the source "
            "(POST /v1/collections/{name}/sources/{id}/run, `ragservice sources run`)"
        )
    if not _has_items(session, job_id):
        raise ConflictError(
            f"job {job_id} no longer has its files and texts (purged after "
            "RAGSERVICE_JOB_PAYLOAD_RETENTION_HOURS); upload them again"
        )
    session.execute(
        update(IngestJob)
        .where(IngestJob.id == job_id)
        .values(
            status=JobStatus.QUEUED,
            attempts=0,
            worker=None,
            claim_key=None,
            heartbeat_at=None,
            started_at=None,
            finished_at=None,
            counts={},
            errors=[],
        )
    )
    session.refresh(job)
    log.info("job %s queued again", job_id)
    return job


def _has_items(session: Session, job_id: uuid.UUID) -> bool:
    first = select(IngestJobItem.ordinal).where(IngestJobItem.job_id == job_id).limit(1)
    return session.scalar(first) is not None


def _of_tenant(tenant_id: uuid.UUID | None) -> list[ColumnElement[bool]]:
    return [] if tenant_id is None else [IngestJob.tenant_id == tenant_id]


def job_places(
    session: Session, job_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, tuple[str, str | None]]:
    """job id → the names of its tenant and collection (None: no collection)."""
    stmt = (
        select(IngestJob.id, Tenant.name, Collection.name)
        .join(Tenant, Tenant.id == IngestJob.tenant_id)
        .outerjoin(Collection, Collection.id == IngestJob.collection_id)
        .where(IngestJob.id.in_(list(job_ids)))
    )
    return {job_id: (tenant, collection) for job_id, tenant, collection in session.execute(stmt)}


def list_jobs(
    session: Session,
    tenant_id: uuid.UUID | None,
    *,
    collection_id: uuid.UUID | None = None,
    collection: str | None = None,
    status: JobStatus | None = None,
    limit: int = 50,
    before: uuid.UUID | None = None,
) -> list[IngestJob]:
    """The tenant's jobs, newest first; `before` is the last job id of the previous page
    (a job id that is not the tenant's gives an empty page). `tenant_id` None: every
    tenant's jobs (for operators, whose transactions see every tenant). `collection`: of the
    collections with that name (one per tenant)."""
    stmt = select(IngestJob).where(*_of_tenant(tenant_id))
    if collection_id is not None:
        stmt = stmt.where(IngestJob.collection_id == collection_id)
    if collection is not None:
        named = select(Collection.id).where(Collection.name == collection)
        stmt = stmt.where(IngestJob.collection_id.in_(named))
    if status is not None:
        stmt = stmt.where(IngestJob.status == status)
    if before is not None:
        position = _job_position(tenant_id, before)
        stmt = stmt.where(tuple_(IngestJob.created_at, IngestJob.id) < position)
    order = (IngestJob.created_at.desc(), IngestJob.id.desc())
    return list(session.scalars(stmt.order_by(*order).limit(limit)))


def _job_position(tenant_id: uuid.UUID | None, job_id: uuid.UUID) -> ScalarSelect[Any]:
    # An alias, so that the subquery is not correlated with the outer query's ingest_jobs.
    cursor = aliased(IngestJob)
    where = [cursor.id == job_id]
    if tenant_id is not None:
        where.append(cursor.tenant_id == tenant_id)
    return select(cursor.created_at, cursor.id).where(*where).scalar_subquery()
