"""Reranker model versions: `reranker_models`, like `embedding_models` for cross-encoders.

`ragservice finetune --reranker` trains a cross-encoder from feedback triplets and registers it
here as version N of its name; `RAGSERVICE_RERANKER=NAME:VERSION` serves it. A separate table,
not a kind column: a reranker has no dimension, vector storage, HNSW index or active flag.

Revision ID: 0018
Revises: 0017
Create Date: 2027-02-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reranker_models",
        sa.Column("id", sa.Integer, sa.Identity(), primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        # The embedding model (or folder) its transformer started from, as NAME:VERSION or path.
        sa.Column("base", sa.Text, nullable=False),
        sa.Column("details", JSONB, server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.UniqueConstraint("name", "version"),
        sa.CheckConstraint("version >= 1", name="reranker_models_version_check"),
    )


def downgrade() -> None:
    op.drop_table("reranker_models")
