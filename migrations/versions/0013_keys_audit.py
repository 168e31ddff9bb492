"""API keys that expire, and an audit log of administrative actions.

- `api_keys.expires_at`: a key may carry an end of life (NULL: none); from then on it gets 401.
  (`last_used_at` exists since 0002; the service now keeps it, to the minute.)
- `audit_log`: who did what to which object: key creations and revocations, collection deletes,
  cache purges, model activations, analysts' changes. Tenant-owned, with the row-level security
  of migration 0007; rows without a tenant (model activations, analysts bound to every tenant)
  are seen by system transactions only. The service role may add and read entries, never change
  or delete them.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

ROLE = "ragservice_service"
POLICY = "tenant_id = (SELECT ragservice_current_tenant()) OR (SELECT ragservice_all_tenants())"


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("expires_at", sa.DateTime(timezone=True)))
    op.create_table(
        "audit_log",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("tenant_id", UUID(as_uuid=True), sa.ForeignKey("tenants.id", ondelete="CASCADE")),
        sa.Column("key_id", UUID(as_uuid=True)),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("details", JSONB, server_default=sa.text("'{}'::jsonb"), nullable=False),
    )
    op.create_index("audit_log_tenant_id_idx", "audit_log", ["tenant_id", "id"])
    op.execute("ALTER TABLE audit_log ENABLE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant_isolation ON audit_log USING ({POLICY})")
    # Default privileges (0007) gave the role every right on new tables: append-only here.
    op.execute(
        f"""
        DO $$
        BEGIN
            IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{ROLE}') THEN
                REVOKE ALL ON audit_log FROM {ROLE};
                GRANT SELECT, INSERT ON audit_log TO {ROLE};
            END IF;
        END $$
        """
    )


def downgrade() -> None:
    op.drop_table("audit_log")
    op.drop_column("api_keys", "expires_at")
