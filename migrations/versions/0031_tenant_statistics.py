"""Extended statistics: a collection belongs to one tenant.

Since searches name the tenant beside the collections (`chunks.tenant_id = …` and
`chunks.collection_id = ANY(…)`, so that a store distributed by tenant runs them on one node),
the planner would multiply the two conditions' selectivities as if they were independent and
estimate a small tenant's collection at a fraction of its rows, enough for it to prefer an exact
scan to the HNSW index for dense searches. Functional-dependency statistics on
`(collection_id, tenant_id)` of `chunks` and `documents` tell it that the collection decides the
tenant, and the estimates are those of the collection alone again. They are built by ANALYZE
(autovacuum's included); the upgrade analyzes the two tables once.

Revision ID: 0031
Revises: 0030
Create Date: 2027-06-16
"""

from __future__ import annotations

from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None

STATISTICS = {
    "chunks_collection_tenant": "chunks",
    "documents_collection_tenant": "documents",
}


def upgrade() -> None:
    for name, table in STATISTICS.items():
        op.execute(
            f"CREATE STATISTICS IF NOT EXISTS {name} (dependencies) "
            f"ON collection_id, tenant_id FROM {table}"
        )
        op.execute(f"ANALYZE {table}")


def downgrade() -> None:
    for name in STATISTICS:
        op.execute(f"DROP STATISTICS IF EXISTS {name}")
