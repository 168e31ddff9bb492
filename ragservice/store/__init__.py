"""The only SQL on tenant data, one module per subject.

Callers import the package and name the subject: `store.jobs.claim_job(...)`.
"""

from ragservice.store import (
    analysts,
    bulk,
    collections,
    documents,
    feedback,
    jobs,
    models,
    prompt_cache,
    query_log,
    tenants,
)

__all__ = [
    "analysts",
    "bulk",
    "collections",
    "documents",
    "feedback",
    "jobs",
    "models",
    "prompt_cache",
    "query_log",
    "tenants",
]
