"""The only SQL on tenant data, one module per subject.

Callers import the package and name the subject: `store.jobs.claim_job(session, ...)`. Every
function takes the caller's session, so a caller decides what commits together (a batch of
documents with its chunks and embeddings, a job with its items).

Names follow one rule: `get_*` returns a row or object, or None; `find_*_id` an id by name, or
None; `require_*_id` an id, or `NotFoundError`; `ensure_*` makes sure a row exists, creating
it when missing, and returns it (or its id).
See docs/architecture.md for when SQL is typed SQLAlchemy, `text()` or composed psycopg SQL.
"""

from ragservice.store import (
    analysts,
    audit,
    bulk,
    collections,
    documents,
    embedding_models,
    feedback,
    indexes,
    insights,
    jobs,
    postings,
    prompt_cache,
    query_log,
    rerankers,
    sources,
    tenants,
)

__all__ = [
    "analysts",
    "audit",
    "bulk",
    "collections",
    "documents",
    "embedding_models",
    "feedback",
    "indexes",
    "insights",
    "jobs",
    "postings",
    "prompt_cache",
    "query_log",
    "rerankers",
    "sources",
    "tenants",
]
