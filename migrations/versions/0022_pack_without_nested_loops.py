"""`ragservice_pack_postings` plans its joins without nested loops.

A pack runs right after a load, before autovacuum has analyzed `chunk_postings`: the planner
then sees none of the new collection's blocks and may join the keys to be packed with the
collection's short blocks by a nested loop that scans all of them once per key. Measured on
SciFact loads (9,832 chunks, ~100,000 short blocks) with the statistics taken before them: one
pack still running after 6 minutes, another past a 60 s statement timeout, against 1.2 s with
nested loops off. Every join in the pack is a bulk join,
so hash or merge joins are right whatever the statistics say.

Revision ID: 0022
Revises: 0021
Create Date: 2027-03-08
"""

from __future__ import annotations

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER FUNCTION ragservice_pack_postings(uuid) SET enable_nestloop = off")


def downgrade() -> None:
    op.execute("ALTER FUNCTION ragservice_pack_postings(uuid) RESET enable_nestloop")
