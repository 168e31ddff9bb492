"""The query log: every answered question, what was retrieved, the answer and its timings.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "query_log",
        sa.Column(
            "id", UUID(as_uuid=True), primary_key=True, server_default=sa.text("gen_random_uuid()")
        ),
        sa.Column(
            "tenant_id",
            UUID(as_uuid=True),
            sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("endpoint", sa.Text, nullable=False),
        sa.Column("question", sa.Text, nullable=False),
        sa.Column(
            "collection_ids",
            ARRAY(UUID(as_uuid=True)),
            server_default=sa.text("'{}'::uuid[]"),
            nullable=False,
        ),
        sa.Column("params", JSONB, server_default=sa.text("'{}'::jsonb"), nullable=False),
        # [{"chunk_id", "document_id", "score"}]: what retrieval returned, in order (the shape
        # is owned by ragservice.store.query_log.RetrievedChunk).
        sa.Column("retrieved", JSONB, server_default=sa.text("'[]'::jsonb"), nullable=False),
        sa.Column("answer", sa.Text),
        sa.Column("citations", JSONB, server_default=sa.text("'[]'::jsonb"), nullable=False),
        sa.Column("timings", JSONB, server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column("upstream_model", sa.Text),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(
            "status IN ('ok', 'extractive', 'upstream_error', 'error')",
            name="query_log_status_check",
        ),
    )
    op.create_index("query_log_tenant_created_idx", "query_log", ["tenant_id", "created_at"])


def downgrade() -> None:
    op.drop_table("query_log")
