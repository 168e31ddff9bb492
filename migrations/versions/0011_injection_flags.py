"""Collections choose what search does with chunks flagged as instruction-like.

`collections.flagged_chunks`: `mark` (returned as ranked, with the flag), `downweight`
(returned with the flag, ranked below unflagged chunks of a similar score; the default) or
`drop` (never returned, so never in a prompt). The flag itself is chunk metadata
(`metadata.injection`, the detector's reasons) written at ingest, so chunks need no column.

Chunks stored before this revision carry no flag: they read as unflagged until their document
changes and is ingested again (an unchanged document is skipped by its content hash). The
migration does not run the detector, which is application code a migration must not import:
`ragservice db rescan` flags them (docs/ingest.md).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A constant default: PostgreSQL adds the column without rewriting the table.
    op.add_column(
        "collections",
        sa.Column("flagged_chunks", sa.Text(), nullable=False, server_default="downweight"),
    )
    op.create_check_constraint(
        "collections_flagged_chunks_check",
        "collections",
        "flagged_chunks IN ('mark', 'downweight', 'drop')",
    )


def downgrade() -> None:
    op.drop_constraint("collections_flagged_chunks_check", "collections", type_="check")
    op.drop_column("collections", "flagged_chunks")
