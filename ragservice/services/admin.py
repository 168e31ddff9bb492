"""What a tenant's admin reads about the tenant: its audit log and its insights (the figures
of the `analytics` views)."""

from __future__ import annotations

import uuid

from ragservice import store
from ragservice.db import Database
from ragservice.db.models import AuditEntry
from ragservice.store.insights import Insights


def audit_entries(
    db: Database, tenant_id: uuid.UUID | None, *, limit: int, before: int | None
) -> list[AuditEntry]:
    """The tenant's audit log, newest first: `limit` entries older than `before`; `tenant_id`
    None: every entry the transaction may see (an operator's, every tenant's)."""
    with db.read() as session:
        return store.audit.list_entries(session, tenant_id, limit=limit, before=before)


def insights(
    db: Database, tenant_id: uuid.UUID, *, days: int, collection: str | None = None
) -> Insights:
    """The tenant's figures over the last `days` UTC days, of one of its collections' questions
    only when `collection` is given (NotFoundError for a name it does not have)."""
    with db.read() as session:
        cid = None
        if collection is not None:
            cid = store.collections.require_collection_id(session, tenant_id, collection)
        return store.insights.insights(session, tenant_id, days=days, collection_id=cid)
