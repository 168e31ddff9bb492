"""The `ragservice_bm25` extension, where it is installed: exact BM25 with block-max pruning.

`extension/` holds a small C extension (built with PGXS against the embedded PostgreSQL by
`make run` and `make test`). Its `ragservice_bm25_topk(collections, terms, weights, k, k1, b)`
returns BM25's exact top k over the `chunk_postings` blocks, reading the blocks from the highest
score bound (`max_tf`, `min_len`, migration 0020) down and skipping those that cannot bring a
chunk into the top k. It reads the tables through SPI as its caller, so row-level security and
grants apply as to the caller's own statements.

A server without the extension's files (an external PostgreSQL, or a service installed without
`make`) is left as it is: full-text search then uses the SQL statement with its per-term postings
budget (`retrieval.statements.BM25`). The extension is not trusted: only a superuser creates it;
a migrating user who is not one gets a warning and the SQL statement stays (docs/operators.md).

Revision ID: 0023
Revises: 0022
Create Date: 2027-03-20
"""

from __future__ import annotations

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

_CREATE_IF_AVAILABLE = """
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'ragservice_bm25') THEN
        BEGIN
            CREATE EXTENSION IF NOT EXISTS ragservice_bm25 SCHEMA public;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'ragservice_bm25 not created: % is no superuser', current_user;
        END;
    END IF;
END $$
"""


def upgrade() -> None:
    op.execute(_CREATE_IF_AVAILABLE)


def downgrade() -> None:
    op.execute("DROP EXTENSION IF EXISTS ragservice_bm25")
