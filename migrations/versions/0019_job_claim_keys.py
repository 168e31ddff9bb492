"""A job's claim tied to its worker's database session: `ingest_jobs.claim_key`.

The worker that claims a job holds a session-level advisory lock with this key on a connection
of its own (`ragservice.db.locks`). PostgreSQL releases it when that connection ends, so a
running job whose key nobody holds any more lost its worker (killed, crashed): any worker takes
it over at once instead of after `RAGSERVICE_JOB_STALE_SECONDS`. NULL for queued and ended jobs
and for claims not tied to a session (those fall back to the heartbeat's timeout).

Revision ID: 0019
Revises: 0018
Create Date: 2027-02-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("ingest_jobs", sa.Column("claim_key", sa.BigInteger, nullable=True))


def downgrade() -> None:
    op.drop_column("ingest_jobs", "claim_key")
