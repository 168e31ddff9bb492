"""The exact BM25 function over given tables, for a store distributed on Citus.

On a Citus worker a query on a shard may not start a distributed query, so
`ragservice_bm25_topk`, which reads `public.chunk_postings` and `public.collection_text_stats`,
cannot run inside a tenant's search there. The extension's version 1.2 adds
`ragservice_bm25_topk_in(postings, totals, collections, terms, weights, k, k1, b)`: the same
search over the given tables, which must be those two or a Citus shard of each (any other table
is refused). `ragservice db distribute` defines `ragservice_bm25_topk_tenant` over it, which
reads the shards holding the asker's tenant, so that a tenant's full-text search runs the exact
function on the worker that holds the tenant.

The extension is updated to 1.2 here where its files offer that version (and created where it
is available but missing, as 0023 does).

Revision ID: 0032
Revises: 0031
Create Date: 2027-06-20
"""

from __future__ import annotations

from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None

_UPDATE_EXTENSION = """
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'ragservice_bm25') THEN
        CREATE EXTENSION IF NOT EXISTS ragservice_bm25 SCHEMA public;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'ragservice_bm25' AND extversion = '1.1')
       AND EXISTS (SELECT 1 FROM pg_available_extension_versions
                   WHERE name = 'ragservice_bm25' AND version = '1.2') THEN
        ALTER EXTENSION ragservice_bm25 UPDATE TO '1.2';
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    -- the extension is not trusted: a superuser creates or updates it (docs/operators.md)
    RAISE WARNING 'ragservice_bm25 not created or updated: % is no superuser', current_user;
END $$
"""

_DOWNGRADE_EXTENSION = """
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'ragservice_bm25' AND extversion = '1.2')
    THEN
        ALTER EXTENSION ragservice_bm25 UPDATE TO '1.1';
    END IF;
END $$
"""


def upgrade() -> None:
    op.execute(_UPDATE_EXTENSION)


def downgrade() -> None:
    op.execute(
        "DROP FUNCTION IF EXISTS ragservice_bm25_topk_tenant(uuid, uuid[], text[], "
        "float8[], integer, float8, float8)"
    )
    op.execute(_DOWNGRADE_EXTENSION)
