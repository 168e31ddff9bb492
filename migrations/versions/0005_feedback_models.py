"""Feedback on answers, the prompt each answer was built from, and model versions that can be
activated and rolled back.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The messages an answer was generated from (system prompt, earlier turns, the question
    # with its numbered sources), so fine-tuning exports show the model what the service did.
    op.add_column("query_log", sa.Column("messages", JSONB))
    op.create_table(
        "feedback",
        sa.Column(
            "id", UUID(as_uuid=True), primary_key=True, server_default=sa.text("gen_random_uuid()")
        ),
        sa.Column(
            "query_id",
            UUID(as_uuid=True),
            sa.ForeignKey("query_log.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "tenant_id",
            UUID(as_uuid=True),
            sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            nullable=False,
        ),
        # +1 / -1 on the "thumbs" scale, 1..5 on "stars"; null when only chunks were judged.
        sa.Column("rating", sa.SmallInteger),
        sa.Column("scale", sa.Text, nullable=False, server_default="thumbs"),
        sa.Column("comment", sa.Text),
        sa.Column("corrected_answer", sa.Text),
        sa.Column(
            "relevant_chunk_ids",
            ARRAY(UUID(as_uuid=True)),
            server_default=sa.text("'{}'::uuid[]"),
            nullable=False,
        ),
        sa.Column(
            "irrelevant_chunk_ids",
            ARRAY(UUID(as_uuid=True)),
            server_default=sa.text("'{}'::uuid[]"),
            nullable=False,
        ),
        sa.Column("key_id", UUID(as_uuid=True)),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint("scale IN ('thumbs', 'stars')", name="feedback_scale_check"),
        sa.CheckConstraint(
            "rating IS NULL OR (scale = 'thumbs' AND rating IN (-1, 1)) "
            "OR (scale = 'stars' AND rating BETWEEN 1 AND 5)",
            name="feedback_rating_check",
        ),
    )
    op.create_index("feedback_query_idx", "feedback", ["query_id"])
    op.create_index("feedback_tenant_created_idx", "feedback", ["tenant_id", "created_at"])

    # Model versions: where a fine-tuned model came from, what its training measured, and the
    # order of activations (rollback goes back one step in it).
    op.add_column(
        "embedding_models",
        sa.Column("base_model_id", sa.Integer, sa.ForeignKey("embedding_models.id")),
    )
    op.add_column(
        "embedding_models",
        sa.Column("details", JSONB, server_default=sa.text("'{}'::jsonb"), nullable=False),
    )
    op.create_table(
        "model_activations",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column(
            "model_id",
            sa.Integer,
            sa.ForeignKey("embedding_models.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "previous_model_id",
            sa.Integer,
            sa.ForeignKey("embedding_models.id", ondelete="SET NULL"),
        ),
        sa.Column(
            "activated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
    )


def downgrade() -> None:
    op.drop_table("model_activations")
    op.drop_column("embedding_models", "details")
    op.drop_column("embedding_models", "base_model_id")
    op.drop_table("feedback")
    op.drop_column("query_log", "messages")
