"""Sources kept in sync: a web site, an S3-compatible bucket or a folder a collection follows.

- `sources`: one per (collection, location); its reader's options, the readers its documents
  get, how often it runs (`every_seconds`, NULL: only when asked; `next_run_at` the next time
  the scheduler queues a run) and whether a run deletes the documents gone from it (`prune`).
- `source_items`: what a source knew of each document at its last run (validators, content
  hash, a page's links: `ingest.sources.base.ItemState` as JSON), by the document's key.
- `ingest_jobs.source_id`: the source a run job syncs (NULL for uploads, and once the source
  is deleted). At most one run of a source is queued or running at any time: a unique partial
  index, so that two workers, two schedulers or two clicks can never run one source twice.

Both tables carry `tenant_id` and the tenant policy of 0007, like every tenant table.

Revision ID: 0027
Revises: 0026
Create Date: 2027-05-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

_TENANT_POLICY = (
    "tenant_id = (SELECT ragservice_current_tenant()) OR (SELECT ragservice_all_tenants())"
)
TABLES = ("sources", "source_items")


def _tenant_column() -> sa.Column[object]:
    return sa.Column(
        "tenant_id",
        postgresql.UUID(),
        sa.ForeignKey("tenants.id", ondelete="CASCADE"),
        nullable=False,
    )


def upgrade() -> None:
    op.create_table(
        "sources",
        sa.Column(
            "id", postgresql.UUID(), primary_key=True, server_default=sa.text("gen_random_uuid()")
        ),
        _tenant_column(),
        sa.Column(
            "collection_id",
            postgresql.UUID(),
            sa.ForeignKey("collections.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("location", sa.Text(), nullable=False),
        sa.Column("options", postgresql.JSONB(), nullable=False, server_default="{}"),
        sa.Column("readers", postgresql.ARRAY(sa.Text()), nullable=True),
        sa.Column("every_seconds", sa.Integer(), nullable=True),
        sa.Column("prune", sa.Boolean(), nullable=False, server_default="true"),
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.CheckConstraint("kind IN ('web', 's3', 'folder')", name="sources_kind_check"),
        # The API asks for at least a minute (`services.sources`); operators may go lower.
        sa.CheckConstraint("every_seconds > 0", name="sources_every_seconds_check"),
        sa.UniqueConstraint("collection_id", "location", name="sources_collection_location_key"),
    )
    op.create_index(
        "sources_due",
        "sources",
        ["next_run_at"],
        postgresql_where=sa.text("next_run_at IS NOT NULL"),
    )
    op.create_table(
        "source_items",
        sa.Column(
            "source_id",
            postgresql.UUID(),
            sa.ForeignKey("sources.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("key", sa.Text(), primary_key=True),
        _tenant_column(),
        sa.Column("state", postgresql.JSONB(), nullable=False, server_default="{}"),
        sa.Column("external_id", sa.Text(), nullable=True),
        sa.Column(
            "seen_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY tenant_isolation ON {table} USING ({_TENANT_POLICY})")
    op.add_column(
        "ingest_jobs",
        sa.Column(
            "source_id",
            postgresql.UUID(),
            sa.ForeignKey("sources.id", ondelete="SET NULL", name="ingest_jobs_source_id_fkey"),
            nullable=True,
        ),
    )
    op.create_index(
        "ingest_jobs_one_run_per_source",
        "ingest_jobs",
        ["source_id"],
        unique=True,
        postgresql_where=sa.text("status IN ('queued', 'running')"),
    )
    op.create_index(
        "ingest_jobs_source_runs",
        "ingest_jobs",
        ["source_id", "created_at"],
        postgresql_where=sa.text("source_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ingest_jobs_source_runs", table_name="ingest_jobs")
    op.drop_index("ingest_jobs_one_run_per_source", table_name="ingest_jobs")
    op.drop_constraint("ingest_jobs_source_id_fkey", "ingest_jobs", type_="foreignkey")
    op.drop_column("ingest_jobs", "source_id")
    op.drop_table("source_items")
    op.drop_index("sources_due", table_name="sources")
    op.drop_table("sources")
