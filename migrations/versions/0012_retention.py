"""What is deleted is gone: the query log knows which documents each answer drew on, and
deleting a document redacts the answers and prompts built from it.

- `query_log.source_document_ids`: the documents retrieved for the question or shown to the
  model (a cache hit: the cached answer's sources), GIN-indexed; backfilled from `retrieved`
  and `citations`.
- `query_log.redacted_at`: when the row's `answer` and `messages` (the prompt, with the
  sources' text) were removed because one of those documents was deleted.
- A statement-level trigger on `documents` does that redaction in the transaction of the
  delete, whatever path deletes (the API, `ragservice ingest --sync`, a collection's cascade).
- Rows of documents deleted before this revision are redacted now.
- `query_log (created_at)`: the retention purge deletes by age across tenants.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY, UUID

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_BACKFILL = """
UPDATE query_log q
SET source_document_ids = ARRAY(
    SELECT DISTINCT CAST(e.item ->> 'document_id' AS uuid)
    FROM jsonb_array_elements(q.retrieved || q.citations) AS e(item)
    WHERE e.item ->> 'document_id' IS NOT NULL)
WHERE jsonb_typeof(q.retrieved) = 'array' AND jsonb_typeof(q.citations) = 'array'
  AND (jsonb_array_length(q.retrieved) > 0 OR jsonb_array_length(q.citations) > 0)
"""

_REDACT_ORPHANS = """
UPDATE query_log q
SET answer = NULL, messages = NULL, redacted_at = now()
WHERE EXISTS (SELECT 1 FROM unnest(q.source_document_ids) AS s(id)
              WHERE NOT EXISTS (SELECT 1 FROM documents d WHERE d.id = s.id))
"""

# Runs as the deleting user: within a request that is the document's tenant, whose query log
# rows are the only ones that can name the document.
_REDACT_DELETED = """
CREATE FUNCTION ragservice_query_log_redact_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE query_log q
    SET answer = NULL, messages = NULL, redacted_at = now()
    WHERE q.source_document_ids && ARRAY(SELECT id FROM old_documents)
      AND q.redacted_at IS NULL;
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.add_column(
        "query_log",
        sa.Column(
            "source_document_ids",
            ARRAY(UUID(as_uuid=True)),
            server_default=sa.text("'{}'::uuid[]"),
            nullable=False,
        ),
    )
    op.add_column("query_log", sa.Column("redacted_at", sa.DateTime(timezone=True)))
    op.execute(_BACKFILL)
    op.execute(_REDACT_ORPHANS)
    op.create_index(
        "query_log_source_documents_idx",
        "query_log",
        ["source_document_ids"],
        postgresql_using="gin",
    )
    op.create_index("query_log_created_idx", "query_log", ["created_at"])
    op.execute(_REDACT_DELETED)
    op.execute(
        "CREATE TRIGGER documents_query_log_redact AFTER DELETE ON documents "
        "REFERENCING OLD TABLE AS old_documents "
        "FOR EACH STATEMENT EXECUTE FUNCTION ragservice_query_log_redact_deleted()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS documents_query_log_redact ON documents")
    op.execute("DROP FUNCTION IF EXISTS ragservice_query_log_redact_deleted()")
    op.drop_index("query_log_created_idx", table_name="query_log")
    op.drop_index("query_log_source_documents_idx", table_name="query_log")
    op.drop_column("query_log", "redacted_at")
    op.drop_column("query_log", "source_document_ids")
