"""The caller's own account, as far as the database knows it: its tenant's name."""

from __future__ import annotations

import uuid

from ragservice import store
from ragservice.db import Database


def tenant_name(db: Database, tenant_id: uuid.UUID) -> str:
    """The tenant's name ('' for a tenant that is gone)."""
    with db.read() as session:
        return store.tenants.get_tenant_name(session, tenant_id) or ""
