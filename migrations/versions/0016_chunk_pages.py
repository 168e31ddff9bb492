"""Chunks know their pages: `chunks.page_start` and `chunks.page_end`.

The pages (1-based, inclusive) of a paged document (a PDF) that a chunk lies on, so a
citation can say `report.pdf, p. 12`. Both are null for a document without pages, and for
chunks stored before this revision: a PDF gets its pages when it is ingested again (its
content hash now covers where its pages start, so the first ingest after this revision
writes it anew, reusing the stored vectors of its unchanged chunks).

Revision ID: 0016
Revises: 0015
Create Date: 2027-01-20
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

CHECK = "chunks_pages_check"


def upgrade() -> None:
    # Nullable without a default: PostgreSQL adds the columns without rewriting the table.
    op.add_column("chunks", sa.Column("page_start", sa.Integer(), nullable=True))
    op.add_column("chunks", sa.Column("page_end", sa.Integer(), nullable=True))
    # Every row stored so far has null pages, which the check allows: NOT VALID skips a
    # scan of the whole table; new and updated rows are checked all the same.
    op.execute(
        f"ALTER TABLE chunks ADD CONSTRAINT {CHECK} CHECK ("
        "(page_start IS NULL AND page_end IS NULL) "
        "OR (page_start >= 1 AND page_end >= page_start)) NOT VALID"
    )


# A document whose chunks lose their pages gets a content hash no ingest computes, so that the
# next ingest of it (under either revision) writes it anew, its pages with it, instead of
# finding it unchanged.
_FORGET_PAGED_HASHES = """
UPDATE documents d SET content_hash = 'pages-dropped:' || d.content_hash
WHERE EXISTS (SELECT FROM chunks c WHERE c.document_id = d.id AND c.page_start IS NOT NULL)
"""


def downgrade() -> None:
    op.execute(_FORGET_PAGED_HASHES)
    op.drop_constraint(CHECK, "chunks", type_="check")
    op.drop_column("chunks", "page_end")
    op.drop_column("chunks", "page_start")
