"""Documents for ingestion. Queued: JSON texts and uploaded files become one ingest job each,
which a worker runs (`ingest/worker.py`); the caller checks the request's configured limits
and reads the files, this resolves the options, refuses duplicates and queues the job. Run
in the caller's process (`ragservice ingest`): the run recorded as a job of its own."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ingest.report import IngestReport
from ragservice import store
from ragservice.db import Database
from ragservice.embedding.registry import get_model_by_name
from ragservice.errors import BadRequestError, InvalidInputError, NotFoundError
from ragservice.services.jobs import JobView, job_view
from ragservice.types import JobStatus


@dataclass(frozen=True)
class TextDocument:
    text: str
    external_id: str | None = None
    """None: `text-` and a hash of the text."""
    title: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    readers: tuple[str, ...] | None = None
    """Checked principals; None: not said (see `LoadedDocument.readers`)."""


@dataclass(frozen=True)
class UploadedFile:
    name: str
    """The file's base name: its external id, and its type by suffix."""
    body: bytes


def queue_texts(
    db: Database, tenant_id: uuid.UUID, collection: str, documents: Sequence[TextDocument]
) -> JobView:
    """Queue the texts as one job; BadRequestError for an external id given twice."""
    items = [
        store.jobs.JobItem(
            kind="text",
            name=doc.external_id or text_id(doc.text),
            title=doc.title,
            body=doc.text.encode(),
            metadata=doc.metadata,
            readers=doc.readers,
        )
        for doc in documents
    ]
    refuse_duplicates([item.name for item in items], "external_id")
    return _enqueue(db, tenant_id, collection, items, {})


def file_options(
    db: Database, *, jsonl_fields: str | None, parquet_columns: str | None, model: str | None
) -> dict[str, Any]:
    """An upload job's options: the JSONL keys and Parquet columns named (a bad spec fails the
    job, with its reason) and the model its vectors are for, as `NAME:VERSION`."""
    named = {"jsonl_fields": jsonl_fields, "parquet_columns": parquet_columns}
    params: dict[str, Any] = {key: value for key, value in named.items() if value}
    if model:
        params["model"] = model_reference(db, model)
    return params


def queue_files(
    db: Database,
    tenant_id: uuid.UUID,
    collection: str,
    files: Sequence[UploadedFile],
    *,
    metadata: dict[str, Any],
    params: dict[str, Any],
    readers: tuple[str, ...] | None = None,
) -> JobView:
    """Queue the files as one job, `metadata` added to each file's documents and `readers`
    given to those that name none (a JSONL row may); `params` from `file_options`. (The caller
    refused duplicate names before it read the files.)"""
    items = [
        store.jobs.JobItem(
            kind="file", name=f.name, title=None, body=f.body, metadata=metadata, readers=readers
        )
        for f in files
    ]
    return _enqueue(db, tenant_id, collection, items, params)


def model_reference(db: Database, ref: str) -> str:
    """`ref` as `NAME:VERSION` of a registered version (InvalidInputError naming the known
    ones otherwise)."""
    with db.read() as session:
        try:
            row = get_model_by_name(session, ref)
        except NotFoundError as exc:
            raise InvalidInputError(f"model: {exc}") from exc
    return f"{row.name}:{row.version}"


def refuse_duplicates(names: list[str], what: str) -> None:
    """BadRequestError for a name given twice in one request."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise BadRequestError(f"duplicate {what} {name!r} in one request")
        seen.add(name)


def text_id(text: str) -> str:
    """The external id of a text sent without one: the same text, the same id."""
    return "text-" + hashlib.sha256(text.encode()).hexdigest()[:24]


def _enqueue(
    db: Database,
    tenant_id: uuid.UUID,
    collection: str,
    items: list[store.jobs.JobItem],
    params: dict[str, Any],
) -> JobView:
    with db.read() as session:
        cid = store.collections.require_collection_id(session, tenant_id, collection)
    with db.write() as session:
        job_id = store.jobs.enqueue_job(
            session,
            tenant_id=tenant_id,
            collection_id=cid,
            kind="upload",
            params={**params, "items": len(items)},
            items=items,
        )
    with db.read() as session:
        job = store.jobs.get_job(session, tenant_id, job_id)
    assert job is not None
    return job_view(job)


@contextmanager
def recorded_run(
    db: Database,
    tenant_id: uuid.UUID,
    collection: str,
    params: dict[str, object],
    report: IngestReport,
    *,
    worker: str,
) -> Iterator[uuid.UUID]:
    """A run in this process recorded as a running job (its collection created when it is
    missing), which ends `done` or `failed` with the counts and failures of `report`
    (`failed` too when the run raises). Workers never take such a job."""
    with db.write() as session:
        collection_id = store.collections.ensure_collection(session, tenant_id, collection)
        job_id = store.jobs.start_job(
            session,
            tenant_id=tenant_id,
            collection_id=collection_id,
            kind="cli",
            params=params,
            worker=worker,
        )
    status = JobStatus.FAILED
    try:
        yield job_id
        status = JobStatus.DONE if report.ok else JobStatus.FAILED
    finally:
        with db.write() as session:
            store.jobs.finish_job(
                session,
                job_id,
                status=status,
                counts=report.counts(),
                errors=[{"source": f.source, "error": f.reason} for f in report.failed],
                restricted=report.restricted,
            )
