"""The service layer against a real PostgreSQL: what its functions add to the store's (the
tenant's scope, names resolved, duplicates refused, audit entries in the same transaction)."""

from __future__ import annotations

import uuid
from datetime import datetime

import pytest

from ragservice import store
from ragservice.bootstrap import Runtime
from ragservice.db import Database
from ragservice.errors import BadRequestError, ConflictError, InvalidInputError, NotFoundError
from ragservice.feedback.exports import ExportFilter, ExportFormat
from ragservice.services import admin, collections, documents, ingest, jobs
from ragservice.services.callers import Operator
from ragservice.services.collections import CollectionChanges, NewCollection
from ragservice.services.feedback import export_feedback


@pytest.fixture
def db(runtime: Runtime) -> Database:
    return runtime.db


@pytest.fixture
def tenant(runtime: Runtime) -> uuid.UUID:
    return runtime.default_tenant_id


@pytest.fixture
def other(db: Database) -> uuid.UUID:
    with db.write() as session:
        return store.tenants.ensure_tenant(session, "other")


def texts(*bodies: str) -> list[ingest.TextDocument]:
    return [ingest.TextDocument(text=body) for body in bodies]


def test_texts_queue_one_job_with_an_id_per_text(db: Database, tenant: uuid.UUID) -> None:
    collections.create_collection(db, tenant, NewCollection(name="notes"))
    docs = [*texts("alpha", "beta"), ingest.TextDocument(text="gamma", external_id="g")]

    job = ingest.queue_texts(db, tenant, "notes", docs)

    with db.read() as session:
        names = [item.name for item in store.jobs.job_items(session, job.id)]
    assert names == [ingest.text_id("alpha"), ingest.text_id("beta"), "g"]
    assert (job.status, job.kind, job.counts, job.errors) == ("queued", "upload", {}, [])
    assert jobs.get_job(db, tenant, job.id) == job


def test_the_same_text_twice_is_refused_before_anything_is_queued(
    db: Database, tenant: uuid.UUID
) -> None:
    collections.create_collection(db, tenant, NewCollection(name="notes"))
    with pytest.raises(BadRequestError, match="duplicate external_id"):
        ingest.queue_texts(db, tenant, "notes", texts("same", "same"))
    assert jobs.list_jobs(db, tenant) == []


def test_a_collection_of_another_tenant_is_not_found(
    db: Database, tenant: uuid.UUID, other: uuid.UUID
) -> None:
    collections.create_collection(db, tenant, NewCollection(name="notes"))
    job = ingest.queue_texts(db, tenant, "notes", texts("alpha"))

    with pytest.raises(NotFoundError, match="collection 'notes' not found"):
        ingest.queue_texts(db, other, "notes", texts("alpha"))
    with pytest.raises(NotFoundError):
        jobs.list_jobs(db, other, collection="notes")
    with pytest.raises(NotFoundError, match=f"job {job.id} not found"):
        jobs.get_job(db, other, job.id)
    with pytest.raises(NotFoundError):
        documents.list_documents(db, other, "notes", limit=10, after=None)


def test_an_operator_sees_every_tenants_jobs_with_their_names(
    db: Database, tenant: uuid.UUID, other: uuid.UUID
) -> None:
    for owner in (tenant, other):
        collections.create_collection(db, owner, NewCollection(name="notes"))
    mine = ingest.queue_texts(db, tenant, "notes", texts("alpha"))
    theirs = ingest.queue_texts(db, other, "notes", texts("beta"))

    every = jobs.list_placed_jobs(db, None, collection="notes")
    only_theirs = jobs.list_placed_jobs(db, other)

    assert [(p.job.id, p.tenant, p.collection) for p in every] == [
        (theirs.id, "other", "notes"),
        (mine.id, "default", "notes"),
    ]
    assert [p.job for p in only_theirs] == [theirs]
    assert jobs.get_placed_job(db, None, mine.id).to_json() == {
        **mine.to_json(),
        "tenant": "default",
        "collection": "notes",
    }
    with pytest.raises(NotFoundError):
        jobs.get_placed_job(db, other, mine.id)


def test_only_a_failed_job_is_retried(db: Database, tenant: uuid.UUID) -> None:
    collections.create_collection(db, tenant, NewCollection(name="notes"))
    job = ingest.queue_texts(db, tenant, "notes", texts("alpha"))
    with pytest.raises(ConflictError):
        jobs.retry_job(db, tenant, job.id)


def test_an_unknown_model_is_refused_naming_the_field(db: Database) -> None:
    assert ingest.file_options(db, jsonl_fields="id=doc", parquet_columns=None, model=None) == {
        "jsonl_fields": "id=doc"
    }
    with pytest.raises(InvalidInputError, match=r"^model: "):
        ingest.file_options(db, jsonl_fields=None, parquet_columns=None, model="nosuch:9")


def test_collection_changes_and_deletes_are_audited_with_them(
    db: Database, tenant: uuid.UUID
) -> None:
    caller = Operator(tenant_id=tenant, actor="cli:test")
    created = collections.create_collection(db, tenant, NewCollection(name="notes"))
    with pytest.raises(ConflictError):
        collections.create_collection(db, tenant, NewCollection(name="notes"))

    changes = CollectionChanges(given=frozenset({"cache_ttl_seconds"}), cache_ttl_seconds=60)
    changed = collections.update_collection(db, caller, "notes", changes)
    purged = collections.purge_cache(db, caller, "notes")
    collections.delete_collection(db, caller, "notes")

    assert (changed.id, changed.cache_ttl_seconds, changed.flagged_chunks) == (
        created.id,
        60,
        "downweight",
    )
    entries = admin.audit_entries(db, tenant, limit=10, before=None)
    assert [(e.action, e.target, e.details, e.actor) for e in entries] == [
        ("collection.delete", "notes", {}, "cli:test"),
        ("cache.purge", "notes", {"purged": purged}, "cli:test"),
        ("collection.update", "notes", {"cache_ttl_seconds": 60}, "cli:test"),
    ]
    with pytest.raises(NotFoundError):
        collections.delete_collection(db, caller, "notes")
    assert len(admin.audit_entries(db, tenant, limit=10, before=None)) == 3


def test_a_missing_document_is_not_found(db: Database, tenant: uuid.UUID) -> None:
    collections.create_collection(db, tenant, NewCollection(name="notes"))
    page = documents.list_documents(db, tenant, "notes", limit=10, after=None)
    assert (page.documents, page.next_after) == ([], None)
    with pytest.raises(NotFoundError, match="document 'x' not found in 'notes'"):
        documents.get_document(db, tenant, "notes", "x", chunks=True)
    with pytest.raises(NotFoundError, match="document 'x' not found in 'notes'"):
        documents.delete_document(db, tenant, "notes", "x")


def test_an_export_is_audited_with_the_times_as_given(db: Database, tenant: uuid.UUID) -> None:
    caller = Operator(tenant_id=tenant, actor="cli:test")
    since = datetime(2026, 1, 1)
    flt = ExportFilter(tenant_id=tenant, since=since)

    lines = b"".join(
        export_feedback(db, caller, ExportFormat.OPENAI_SFT, flt, negatives_per_positive=1)
    )

    assert lines == b""
    [entry] = admin.audit_entries(db, tenant, limit=10, before=None)
    assert (entry.action, entry.target, entry.details) == (
        "feedback.export",
        "openai-sft",
        {"collection": None, "since": since.isoformat(), "until": None},
    )
