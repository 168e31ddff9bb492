"""The semantic prompt cache, its sources, and its invalidation by document changes.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import Vector
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# An entry built from a document is removed in the same transaction that changes or deletes
# that document, whatever path the change takes (ingest, the API, a cascade, plain SQL).
_INVALIDATE_UPDATED = """
CREATE FUNCTION ragservice_cache_invalidate_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM prompt_cache c
    USING prompt_cache_sources s, new_documents d
    WHERE s.entry_id = c.id AND s.document_id = d.id AND s.document_version < d.version;
    RETURN NULL;
END $$
"""

# A new document may answer a question better than what was cached for its collection: the
# entries covering that collection go (ingest batches insert many documents per statement).
_INVALIDATE_INSERTED = """
CREATE FUNCTION ragservice_cache_invalidate_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM prompt_cache c
    WHERE c.collection_ids && ARRAY(SELECT DISTINCT collection_id FROM new_documents);
    RETURN NULL;
END $$
"""

_INVALIDATE_DELETED = """
CREATE FUNCTION ragservice_cache_invalidate_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM prompt_cache c
    USING prompt_cache_sources s, old_documents d
    WHERE s.entry_id = c.id AND s.document_id = d.id;
    RETURN NULL;
END $$
"""

# Like the chunk embeddings: one partial HNSW index per embedding model over the prompt vectors.
_ENSURE_INDEX = """
CREATE FUNCTION ragservice_ensure_cache_index(p_model_id integer, p_dimension integer)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    index_name text := format('prompt_cache_hnsw_model_%s', p_model_id);
BEGIN
    EXECUTE format(
        'CREATE INDEX IF NOT EXISTS %I ON prompt_cache '
        'USING hnsw ((embedding::vector(%s)) vector_cosine_ops) WHERE model_id = %s',
        index_name, p_dimension, p_model_id);
    RETURN index_name;
END $$
"""


def upgrade() -> None:
    op.add_column(
        "collections",
        sa.Column("cache_ttl_seconds", sa.Integer, sa.CheckConstraint("cache_ttl_seconds > 0")),
    )
    op.create_table(
        "prompt_cache",
        sa.Column(
            "id", UUID(as_uuid=True), primary_key=True, server_default=sa.text("gen_random_uuid()")
        ),
        sa.Column(
            "tenant_id",
            UUID(as_uuid=True),
            sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("scope", sa.Text, nullable=False),
        sa.Column(
            "model_id",
            sa.Integer,
            sa.ForeignKey("embedding_models.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("collection_ids", ARRAY(UUID(as_uuid=True)), nullable=False),
        sa.Column("prompt_hash", sa.Text, nullable=False),
        sa.Column("prompt", sa.Text, nullable=False),
        sa.Column("embedding", Vector(), nullable=False),
        sa.Column("answer", sa.Text, nullable=False),
        sa.Column("response", JSONB, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("hits", sa.Integer, server_default="0", nullable=False),
        sa.Column("last_hit_at", sa.DateTime(timezone=True)),
        sa.UniqueConstraint("scope", "prompt_hash"),
    )
    op.create_index("prompt_cache_expires_idx", "prompt_cache", ["expires_at"])
    op.create_index(
        "prompt_cache_collections_idx", "prompt_cache", ["collection_ids"], postgresql_using="gin"
    )
    op.create_table(
        "prompt_cache_sources",
        sa.Column(
            "entry_id",
            UUID(as_uuid=True),
            sa.ForeignKey("prompt_cache.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("document_id", UUID(as_uuid=True), nullable=False),
        sa.Column("document_version", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("entry_id", "document_id"),
    )
    op.create_index("prompt_cache_sources_document_idx", "prompt_cache_sources", ["document_id"])
    op.execute(_INVALIDATE_UPDATED)
    op.execute(_INVALIDATE_INSERTED)
    op.execute(_INVALIDATE_DELETED)
    op.execute(_ENSURE_INDEX)
    op.execute(
        "CREATE TRIGGER documents_cache_invalidate_updated AFTER UPDATE ON documents "
        "REFERENCING NEW TABLE AS new_documents "
        "FOR EACH STATEMENT EXECUTE FUNCTION ragservice_cache_invalidate_updated()"
    )
    op.execute(
        "CREATE TRIGGER documents_cache_invalidate_inserted AFTER INSERT ON documents "
        "REFERENCING NEW TABLE AS new_documents "
        "FOR EACH STATEMENT EXECUTE FUNCTION ragservice_cache_invalidate_inserted()"
    )
    op.execute(
        "CREATE TRIGGER documents_cache_invalidate_deleted AFTER DELETE ON documents "
        "REFERENCING OLD TABLE AS old_documents "
        "FOR EACH STATEMENT EXECUTE FUNCTION ragservice_cache_invalidate_deleted()"
    )
    op.add_column("query_log", sa.Column("cache", JSONB))


def downgrade() -> None:
    op.drop_column("query_log", "cache")
    op.execute("DROP TRIGGER IF EXISTS documents_cache_invalidate_updated ON documents")
    op.execute("DROP TRIGGER IF EXISTS documents_cache_invalidate_deleted ON documents")
    op.execute("DROP TRIGGER IF EXISTS documents_cache_invalidate_inserted ON documents")
    op.execute("DROP FUNCTION IF EXISTS ragservice_cache_invalidate_inserted()")
    op.execute("DROP FUNCTION IF EXISTS ragservice_cache_invalidate_updated()")
    op.execute("DROP FUNCTION IF EXISTS ragservice_cache_invalidate_deleted()")
    op.execute("DROP FUNCTION IF EXISTS ragservice_ensure_cache_index(integer, integer)")
    op.drop_table("prompt_cache_sources")
    op.drop_table("prompt_cache")
    op.drop_column("collections", "cache_ttl_seconds")
