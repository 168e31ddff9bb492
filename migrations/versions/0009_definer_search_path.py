"""SECURITY DEFINER functions search pg_temp last.

Migration 0007 gave the service's run-time DDL functions `search_path = public`. With that path
PostgreSQL still searches the session's temporary schema first for relations (it goes in front
unless the path names it), so a session could shadow `chunk_embeddings` with a temporary table
and have the function work on it with the owner's rights. The path is now
`pg_catalog, public, pg_temp`, as PostgreSQL's documentation advises for such functions.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

DEFINER_FUNCTIONS = (
    "ragservice_ensure_embedding_index(integer, integer, integer, integer)",
    "ragservice_ensure_cache_index(integer, integer)",
    "ragservice_drop_embedding_index(integer)",
)
SEARCH_PATH = "pg_catalog, public, pg_temp"


def upgrade() -> None:
    for signature in DEFINER_FUNCTIONS:
        op.execute(f"ALTER FUNCTION {signature} SET search_path = {SEARCH_PATH}")


def downgrade() -> None:
    for signature in DEFINER_FUNCTIONS:
        op.execute(f"ALTER FUNCTION {signature} SET search_path = public")
