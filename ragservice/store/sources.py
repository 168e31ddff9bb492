"""Sources and what each knew of its documents; their run jobs (one queued or running at most).

A source's run is an ingest job of kind `source` (`SOURCE_JOB_KIND`) that names it in
`ingest_jobs.source_id`; the unique partial index `ingest_jobs_one_run_per_source` (migration
0027) lets one run of a source be queued or running at a time, whoever queues it: a second
insert does nothing (`ON CONFLICT DO NOTHING`) and the caller says so. A run the CLI makes in
its own process is a `cli` job naming the source, claimed like a worker's (an advisory lock
on a connection of its own), so that it blocks other runs while it lives and no longer once
its process died.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection as Sized
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Text,
    and_,
    delete,
    exists,
    func,
    literal,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from ragservice.db import locks, tenancy
from ragservice.db.models import Collection, Document, IngestJob, Source, SourceItem
from ragservice.db.scope import current_asker
from ragservice.errors import ConflictError
from ragservice.store.jobs import CLI_JOB_KIND
from ragservice.types import ACTIVE_JOB_STATUSES, JobStatus

SOURCE_JOB_KIND = "source"
"""Jobs that sync a source; workers claim them like uploads."""


@dataclass(frozen=True, slots=True)
class NewSource:
    """A source to record (checked by the caller: `services.sources`)."""

    tenant_id: uuid.UUID
    collection_id: uuid.UUID
    kind: str
    location: str
    options: dict[str, Any]
    readers: Sequence[str] | None
    every_seconds: int | None
    prune: bool
    credentials: dict[str, str] | None = None
    """What it is read with (`ingest.sources.credentials`); never shown."""


def add_source(session: Session, new: NewSource) -> Source:
    """Record a source; its first scheduled run is one interval from now (a run wanted at
    once is queued by the caller). ConflictError when the collection has one at `location`.
    Its runs replace only the documents its adder (the asker now) may read (`writes_as`)."""
    if find_source(session, new.collection_id, new.location) is not None:
        raise ConflictError(f"the collection already has a source at {new.location!r}")
    source = Source(
        tenant_id=new.tenant_id,
        collection_id=new.collection_id,
        kind=new.kind,
        location=new.location,
        options=new.options,
        readers=None if new.readers is None else list(new.readers),
        writes_as=tenancy.asker_principals(),
        every_seconds=new.every_seconds,
        prune=new.prune,
        credentials=new.credentials,
    )
    session.add(source)
    session.flush()
    if new.every_seconds is not None:
        session.execute(
            update(Source)
            .where(Source.id == source.id)
            .values(next_run_at=func.now() + timedelta(seconds=new.every_seconds))
        )
    session.refresh(source)
    return source


def find_source(session: Session, collection_id: uuid.UUID, location: str) -> Source | None:
    """The collection's source at `location`; None when it has none."""
    stmt = select(Source).where(Source.collection_id == collection_id, Source.location == location)
    return session.scalar(stmt)


def set_credentials(
    session: Session, source_id: uuid.UUID, credentials: dict[str, str] | None
) -> None:
    """Replace what the source is read with (None: nothing, the reader's defaults)."""
    session.execute(update(Source).where(Source.id == source_id).values(credentials=credentials))


def get_source(session: Session, collection_id: uuid.UUID, source_id: uuid.UUID) -> Source | None:
    """The collection's source `source_id`; None for another collection's, as for none."""
    stmt = select(Source).where(Source.collection_id == collection_id, Source.id == source_id)
    return session.scalar(stmt)


def source_by_id(session: Session, source_id: uuid.UUID) -> Source | None:
    """Any source the transaction sees (a run job names its source by id only)."""
    return session.scalar(select(Source).where(Source.id == source_id))


def list_sources(session: Session, collection_id: uuid.UUID) -> list[Source]:
    """The collection's sources, oldest first."""
    stmt = select(Source).where(Source.collection_id == collection_id)
    return list(session.scalars(stmt.order_by(Source.created_at, Source.id)))


def count_sources(session: Session, collection_id: uuid.UUID) -> int:
    stmt = select(func.count()).select_from(Source).where(Source.collection_id == collection_id)
    return int(session.scalar(stmt) or 0)


def collection_name(session: Session, collection_id: uuid.UUID) -> str | None:
    return session.scalar(select(Collection.name).where(Collection.id == collection_id))


def delete_source(session: Session, source_id: uuid.UUID) -> bool:
    """Delete a source with what it knew of its documents; its jobs stay, naming none. The
    documents stay too unless the caller deletes them first (`delete_source_documents`)."""
    # On a distributed store no foreign key sets this (the jobs stay on the coordinator).
    session.execute(
        update(IngestJob).where(IngestJob.source_id == source_id).values(source_id=None)
    )
    stmt = delete(Source).where(Source.id == source_id).returning(Source.id)
    return session.scalar(stmt) is not None


# -- what a source knew of its documents ---------------------------------------------------


def item_states(session: Session, source_id: uuid.UUID) -> dict[str, dict[str, Any]]:
    """key → the state (JSON) of each document the source knew at its last run."""
    stmt = select(SourceItem.key, SourceItem.state).where(SourceItem.source_id == source_id)
    return {key: state for key, state in session.execute(stmt)}


def save_items(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    source_id: uuid.UUID,
    states: Mapping[str, dict[str, Any]],
) -> None:
    """Record (insert or replace) the states of documents seen in this run; key is also the
    document's external id."""
    if not states:
        return
    rows = [
        {
            "source_id": source_id,
            "key": key,
            "tenant_id": tenant_id,
            "state": state,
            "external_id": key,
        }
        for key, state in states.items()
    ]
    stmt = pg_insert(SourceItem).values(rows)
    stmt = stmt.on_conflict_do_update(
        index_elements=[SourceItem.source_id, SourceItem.key, SourceItem.tenant_id],
        set_={"state": stmt.excluded.state, "seen_at": stmt.excluded.seen_at},
    )
    session.execute(stmt)


def delete_items(session: Session, source_id: uuid.UUID, keys: Sized[str]) -> None:
    if keys:
        session.execute(
            delete(SourceItem).where(
                SourceItem.source_id == source_id, SourceItem.key.in_(list(keys))
            )
        )


def delete_source_documents(
    session: Session, collection_id: uuid.UUID, keys: Sized[str]
) -> list[str]:
    """Delete the collection's documents a source brought under `keys`: a document whose
    external id is a key, or whose `source` is one (the rows of a JSONL file) or lies inside
    one (`<key>/<name>`: an e-mail's attachments, an mbox's messages). Their chunks and
    embeddings go with them, and the documents' triggers drop the cached answers built on
    them. Returns the deleted documents' external ids."""
    if not keys:
        return []
    wanted = list(keys)
    stmt = (
        delete(Document)
        .where(
            Document.collection_id == collection_id,
            or_(
                Document.external_id.in_(wanted),
                Document.source.in_(wanted),
                _inside_any(wanted),
            ),
        )
        .returning(Document.external_id)
    )
    return sorted(session.scalars(stmt))


def delete_stale_rows(
    session: Session, collection_id: uuid.UUID, key: str, keep: Sized[str]
) -> list[str]:
    """Delete the documents a changed file (`key`) held before and holds no longer (a JSONL
    row removed, an attachment gone from an e-mail): those with `source` = key, or inside it
    (`<key>/<name>`), whose external id is not in `keep`."""
    stmt = (
        delete(Document)
        .where(
            Document.collection_id == collection_id,
            or_(Document.source == key, _inside_any([key])),
            Document.external_id.not_in(list(keep)),
        )
        .returning(Document.external_id)
    )
    return sorted(session.scalars(stmt))


def _inside_any(keys: list[str]) -> ColumnElement[bool]:
    """The document came from a file embedded in one of `keys` (its source is `<key>/…`)."""
    parents = func.unnest(literal(keys, ARRAY(Text))).table_valued("key").render_derived("parents")
    inside = func.starts_with(Document.source, func.concat(parents.c.key, "/"))
    return exists(select(literal(1)).select_from(parents).where(inside))


def known_keys(session: Session, source_id: uuid.UUID) -> list[str]:
    stmt = select(SourceItem.key).where(SourceItem.source_id == source_id)
    return list(session.scalars(stmt))


# -- runs ------------------------------------------------------------------------------------


def queue_run(session: Session, source: Source) -> uuid.UUID | None:
    """Queue a run of `source` for the workers; None when one is queued or running already."""
    fail_abandoned_cli_runs(session, source.id)
    return _insert_run(session, source, kind=SOURCE_JOB_KIND, status=JobStatus.QUEUED)


def start_cli_run(
    session: Session, source: Source, *, worker: str, claim_key: int
) -> uuid.UUID | None:
    """Record a run the CLI makes now in its own process, its claim tied to the advisory lock
    `claim_key` (see the module's docstring); None when a run is queued or running already."""
    fail_abandoned_cli_runs(session, source.id)
    return _insert_run(
        session,
        source,
        kind=CLI_JOB_KIND,
        status=JobStatus.RUNNING,
        worker=worker,
        claim_key=claim_key,
        attempts=1,
        heartbeat_at=func.now(),
        started_at=func.now(),
    )


def _insert_run(session: Session, source: Source, **values: Any) -> uuid.UUID | None:
    stmt = (
        pg_insert(IngestJob)
        .values(
            tenant_id=source.tenant_id,
            collection_id=source.collection_id,
            source_id=source.id,
            params={"source_id": str(source.id)},
            asker=current_asker(),
            restricted=bool(source.readers),
            **values,
        )
        .on_conflict_do_nothing(
            index_elements=[IngestJob.source_id, IngestJob.tenant_id],
            index_where=IngestJob.status.in_(ACTIVE_JOB_STATUSES),
        )
        .returning(IngestJob.id)
    )
    return session.scalar(stmt)


def fail_abandoned_cli_runs(session: Session, source_id: uuid.UUID | None = None) -> int:
    """Mark failed the CLI runs of sources (of one, or of all) whose process died: their
    claim's advisory lock is free. Workers never take `cli` jobs over, so without this a
    killed `ragservice sources run` would block its source for good."""
    where = [
        IngestJob.kind == CLI_JOB_KIND,
        IngestJob.status == JobStatus.RUNNING,
        IngestJob.source_id.is_not(None),
        IngestJob.claim_key.is_not(None),
        ~locks.lock_held(IngestJob.claim_key),
    ]
    if source_id is not None:
        where.append(IngestJob.source_id == source_id)
    stmt = (
        update(IngestJob)
        .where(and_(*where))
        .values(
            status=JobStatus.FAILED,
            finished_at=func.now(),
            claim_key=None,
            errors=[{"error": "the command running it ended before the run did"}],
        )
        .returning(IngestJob.id)
    )
    return len(session.scalars(stmt).all())


def active_run(session: Session, source_id: uuid.UUID) -> uuid.UUID | None:
    """The run of the source queued or running now, if any."""
    stmt = select(IngestJob.id).where(
        IngestJob.source_id == source_id, IngestJob.status.in_(ACTIVE_JOB_STATUSES)
    )
    return session.scalar(stmt)


def last_runs(session: Session, source_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, IngestJob]:
    """source id → its newest run job (that the transaction may see)."""
    if not source_ids:
        return {}
    stmt = (
        select(IngestJob)
        .where(IngestJob.source_id.in_(list(source_ids)))
        .order_by(IngestJob.source_id, IngestJob.created_at.desc(), IngestJob.id.desc())
        .ext(distinct_on(IngestJob.source_id))
    )
    return {job.source_id: job for job in session.scalars(stmt) if job.source_id is not None}


# Two statements, not one with a modifying CTE: on a distributed store the sources are spread
# over the workers and the job queue stays on the coordinator. The next run is the transaction's
# time plus the interval, from the time read first (Citus evaluates no stable function of a
# column in an UPDATE).
_NOW = text("SELECT extract(epoch FROM now())::float8")
_MOVE_DUE = text(
    """
    UPDATE sources
    SET next_run_at = to_timestamp(:now + every_seconds)
    WHERE next_run_at <= now() AND every_seconds IS NOT NULL
    RETURNING id, tenant_id, collection_id, coalesce(cardinality(readers), 0) > 0
    """
)
# The statuses spelled in SQL: the partial unique index's own predicate (ACTIVE_JOB_STATUSES).
_QUEUE_RUNS = text(
    """
    INSERT INTO ingest_jobs (tenant_id, collection_id, source_id, kind, status, params, restricted)
    SELECT u.tenant_id, u.collection_id, u.id, :kind, 'queued',
           jsonb_build_object('source_id', u.id::text), u.restricted
    FROM unnest(CAST(:ids AS uuid[]), CAST(:tenants AS uuid[]), CAST(:collections AS uuid[]),
                CAST(:restricted AS boolean[])) AS u(id, tenant_id, collection_id, restricted)
    ON CONFLICT (source_id, tenant_id) WHERE status IN ('queued', 'running') DO NOTHING
    RETURNING id
    """
)


def queue_due_runs(session: Session) -> list[uuid.UUID]:
    """Queue a run of every source whose time has come (of every tenant the transaction
    sees) and move its next run one interval on; a source whose run is still queued or
    running gets none this time. Returns the jobs queued. Schedulers of several processes may
    run at once: the update's row locks give each due source to one of them."""
    fail_abandoned_cli_runs(session)
    now = session.scalar(_NOW)
    due = session.execute(_MOVE_DUE, {"now": now}).all()
    if not due:
        return []
    ids, tenants, collections, restricted = (list(column) for column in zip(*due, strict=True))
    rows = session.execute(
        _QUEUE_RUNS,
        {
            "kind": SOURCE_JOB_KIND,
            "ids": ids,
            "tenants": tenants,
            "collections": collections,
            "restricted": restricted,
        },
    )
    return [row[0] for row in rows]
