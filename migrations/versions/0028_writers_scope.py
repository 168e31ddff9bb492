"""Writes bounded by reads: jobs and sources remember whose documents they may replace, and a
readers change drops the cached answers it widens.

- `ingest_jobs.writes_as`, `sources.writes_as`: the principal set of the caller that queued
  the job or added the source (`{user:ana,group:hr}`; `{}`: a key of no user, which reads the
  unrestricted documents only; NULL: every document of the tenant, for admin keys of no user
  and operators). An ingest replaces, re-permissions or reports on a stored document only when
  that set may read it (`ingest.pipeline`); otherwise the document is refused, per document.
- The documents' readers trigger of 0026 also deletes, in the changed document's collections,
  the cached answers built for an asker who could not read the document before the change and
  can now (their answers were built without it: a fresh search would find it). Entries built on
  the document went already; entries built for askers who read every document stay.

Revision ID: 0028
Revises: 0027
Create Date: 2027-06-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

# The upkeep runs reading every document of the tenant (see 0026's `_ELEVATE`).
_ELEVATE = (
    "$$\nDECLARE\n    saved text := coalesce(current_setting('ragservice.readers', true), '');\n"
    "BEGIN\n    PERFORM set_config('ragservice.readers', '*', true);\n"
)
_RESTORE = "    PERFORM set_config('ragservice.readers', saved, true);\n    RETURN NULL;"

# A principal set `p.built_for` reads a document of readers `r` when `r` is empty or shared.
_READ_BEFORE = "(o.readers IS NULL OR cardinality(o.readers) = 0 OR p.built_for && o.readers)"
_READ_AFTER = "(n.readers IS NULL OR cardinality(n.readers) = 0 OR p.built_for && n.readers)"

_READERS_CHANGED = f"""
CREATE OR REPLACE FUNCTION ragservice_documents_readers_changed() RETURNS trigger
LANGUAGE plpgsql AS {_ELEVATE}
    WITH changed AS (
        SELECT n.id, n.readers FROM new_documents n JOIN old_documents o USING (id)
        WHERE n.readers IS DISTINCT FROM o.readers
    ), chunks_changed AS (
        UPDATE chunks c SET readers = changed.readers FROM changed
        WHERE c.document_id = changed.id AND c.readers IS DISTINCT FROM changed.readers
    )
    DELETE FROM prompt_cache p USING prompt_cache_sources s, changed
    WHERE s.entry_id = p.id AND s.document_id = changed.id;
    DELETE FROM prompt_cache p
    USING new_documents n JOIN old_documents o USING (id)
    WHERE n.readers IS DISTINCT FROM o.readers
      AND p.collection_ids @> ARRAY[n.collection_id]
      AND p.built_for <> '{{*}}'::text[]
      AND NOT {_READ_BEFORE} AND {_READ_AFTER};
{_RESTORE}
END $$
"""

# 0026's definition, put back by a downgrade.
_READERS_CHANGED_0026 = f"""
CREATE OR REPLACE FUNCTION ragservice_documents_readers_changed() RETURNS trigger
LANGUAGE plpgsql AS {_ELEVATE}
    WITH changed AS (
        SELECT n.id, n.readers FROM new_documents n JOIN old_documents o USING (id)
        WHERE n.readers IS DISTINCT FROM o.readers
    ), chunks_changed AS (
        UPDATE chunks c SET readers = changed.readers FROM changed
        WHERE c.document_id = changed.id AND c.readers IS DISTINCT FROM changed.readers
    )
    DELETE FROM prompt_cache p USING prompt_cache_sources s, changed
    WHERE s.entry_id = p.id AND s.document_id = changed.id;
{_RESTORE}
END $$
"""


def upgrade() -> None:
    for table in ("ingest_jobs", "sources"):
        op.add_column(table, sa.Column("writes_as", postgresql.ARRAY(sa.Text()), nullable=True))
    op.execute(_READERS_CHANGED)


def downgrade() -> None:
    op.execute(_READERS_CHANGED_0026)
    for table in ("ingest_jobs", "sources"):
        op.drop_column(table, "writes_as")
