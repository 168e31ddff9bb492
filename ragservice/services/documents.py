"""A collection's documents: a page of them, one with its chunks, one deleted. (Adding
documents is an ingest job: `services/ingest.py`.)"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from ragservice import store
from ragservice.db import Database
from ragservice.db.models import Chunk, Document
from ragservice.errors import NotFoundError
from ragservice.services.callers import Caller, audit


@dataclass(frozen=True)
class DocumentPage:
    documents: list[Document]
    next_after: str | None
    """The last external id of this page when there is a next one, else None."""


@dataclass(frozen=True)
class DocumentWithChunks:
    document: Document
    chunks: list[Chunk] | None
    """In order; None when they were not asked for."""


def list_documents(
    db: Database, tenant_id: uuid.UUID, collection: str, *, limit: int, after: str | None
) -> DocumentPage:
    """The collection's documents ordered by external id, `limit` of them after `after`."""
    with db.read() as session:
        cid = store.collections.require_collection_id(session, tenant_id, collection)
        page = store.documents.list_documents(session, cid, limit=limit + 1, after=after)
    more = len(page) > limit
    page = page[:limit]
    return DocumentPage(documents=page, next_after=page[-1].external_id if more else None)


def get_document(
    db: Database, tenant_id: uuid.UUID, collection: str, external_id: str, *, chunks: bool
) -> DocumentWithChunks:
    """The document, with its chunks when `chunks`; NotFoundError for a missing one."""
    with db.read() as session:
        cid = store.collections.require_collection_id(session, tenant_id, collection)
        doc = store.documents.get_document(session, cid, external_id)
        if doc is None:
            raise document_not_found(collection, external_id)
        found = store.documents.document_chunks(session, doc.id) if chunks else None
    return DocumentWithChunks(doc, found)


def delete_document(db: Database, tenant_id: uuid.UUID, collection: str, external_id: str) -> None:
    """Delete the document with its chunks and embeddings; NotFoundError for a missing one."""
    with db.write() as session:
        cid = store.collections.require_collection_id(session, tenant_id, collection)
        if not store.documents.delete_documents(session, cid, [external_id]):
            raise document_not_found(collection, external_id)


def set_readers(
    db: Database,
    caller: Caller,
    collection: str,
    external_id: str,
    readers: tuple[str, ...] | None,
) -> Document:
    """Give the document new readers (None or empty: the whole tenant), its chunks too, without
    re-embedding anything; the cached answers built on it are dropped. Audited. NotFoundError
    for a document the caller cannot read, as for one that does not exist."""
    with db.write() as session:
        cid = store.collections.require_collection_id(session, caller.tenant_id, collection)
        doc = store.documents.get_document(session, cid, external_id)
        if doc is None:
            raise document_not_found(collection, external_id)
        changed = store.documents.set_readers(session, doc.id, readers)
        details = {
            "collection": collection,
            "readers": list(readers) if readers else None,
            "changed": changed,
        }
        audit(session, caller, "document.readers", external_id, details)
        session.expunge(doc)  # shown as changed, though the caller may no longer read it
    doc.readers = list(readers) if readers else None
    return doc


def document_not_found(collection: str, external_id: str) -> NotFoundError:
    return NotFoundError(f"document {external_id!r} not found in {collection!r}")
