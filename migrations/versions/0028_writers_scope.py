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

import importlib.util
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

# A principal set `p.built_for` reads a document of readers `r` when `r` is empty or shared.
_READ_BEFORE = "(o.readers IS NULL OR cardinality(o.readers) = 0 OR p.built_for && o.readers)"
_READ_AFTER = "(n.readers IS NULL OR cardinality(n.readers) = 0 OR p.built_for && n.readers)"

# Added to 0026's readers trigger, before it restores the asker's set: the entries widened.
_DROP_WIDENED = f"""    DELETE FROM prompt_cache p
    USING new_documents n JOIN old_documents o USING (id)
    WHERE n.readers IS DISTINCT FROM o.readers
      AND p.collection_ids @> ARRAY[n.collection_id]
      AND p.built_for <> '{{*}}'::text[]
      AND NOT {_READ_BEFORE} AND {_READ_AFTER};
"""


def _readers_changed(widened: bool) -> str:
    """0026's definition of the readers trigger's function, replacing it; with `widened`, it
    also drops the entries the change widens."""
    earlier = _migration("0026_document_readers.py")
    body: str = earlier._READERS_CHANGED.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    if not widened:
        return body
    assert body.count(earlier._RESTORE) == 1, body
    return body.replace(earlier._RESTORE, _DROP_WIDENED + earlier._RESTORE)


def _migration(filename: str) -> Any:
    """An earlier migration's module (its name starts with a digit: loaded by path)."""
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"ragservice_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def upgrade() -> None:
    for table in ("ingest_jobs", "sources"):
        op.add_column(table, sa.Column("writes_as", postgresql.ARRAY(sa.Text()), nullable=True))
    op.execute(_readers_changed(widened=True))


def downgrade() -> None:
    op.execute(_readers_changed(widened=False))
    for table in ("ingest_jobs", "sources"):
        op.drop_column(table, "writes_as")
