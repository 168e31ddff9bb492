"""Initial schema: tenants, collections, documents, chunks, embedding models, embeddings, jobs.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import Vector
from sqlalchemy.dialects.postgresql import JSONB, TSVECTOR, UUID

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

DEFAULT_TENANT_ID = "00000000-0000-0000-0000-000000000001"


def _id() -> sa.Column[object]:
    return sa.Column(
        "id", UUID(as_uuid=True), primary_key=True, server_default=sa.text("gen_random_uuid()")
    )


def _tenant() -> sa.Column[object]:
    return sa.Column(
        "tenant_id",
        UUID(as_uuid=True),
        sa.ForeignKey("tenants.id", ondelete="CASCADE"),
        nullable=False,
    )


def _collection(nullable: bool = False) -> sa.Column[object]:
    return sa.Column(
        "collection_id",
        UUID(as_uuid=True),
        sa.ForeignKey("collections.id", ondelete="CASCADE"),
        nullable=nullable,
    )


def _timestamp(name: str) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False)


def _jsonb(name: str, default: str = "{}") -> sa.Column[object]:
    return sa.Column(name, JSONB, server_default=sa.text(f"'{default}'::jsonb"), nullable=False)


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.create_table(
        "tenants",
        _id(),
        sa.Column("name", sa.Text, nullable=False, unique=True),
        _timestamp("created_at"),
    )
    op.execute(
        sa.text("INSERT INTO tenants (id, name) VALUES (CAST(:id AS uuid), 'default')").bindparams(
            id=DEFAULT_TENANT_ID
        )
    )
    op.create_table(
        "collections",
        _id(),
        _tenant(),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("description", sa.Text),
        _jsonb("metadata"),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.UniqueConstraint("tenant_id", "name"),
    )
    op.create_table(
        "documents",
        _id(),
        _tenant(),
        _collection(),
        sa.Column("external_id", sa.Text, nullable=False),
        sa.Column("title", sa.Text),
        sa.Column("source", sa.Text),
        _jsonb("metadata"),
        sa.Column("content_hash", sa.Text, nullable=False),
        sa.Column("version", sa.Integer, nullable=False, server_default="1"),
        sa.Column("chunk_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("char_count", sa.Integer, nullable=False, server_default="0"),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.UniqueConstraint("collection_id", "external_id"),
    )
    op.create_index("documents_tenant_idx", "documents", ["tenant_id"])
    op.create_index("documents_metadata_idx", "documents", ["metadata"], postgresql_using="gin")
    op.create_table(
        "chunks",
        sa.Column("id", UUID(as_uuid=True), primary_key=True),
        _tenant(),
        _collection(),
        sa.Column(
            "document_id",
            UUID(as_uuid=True),
            sa.ForeignKey("documents.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("ordinal", sa.Integer, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("token_count", sa.Integer, nullable=False),
        sa.Column("content_hash", sa.Text, nullable=False),
        sa.Column("start_char", sa.Integer, nullable=False),
        sa.Column("end_char", sa.Integer, nullable=False),
        _jsonb("metadata"),
        sa.Column(
            "tsv",
            TSVECTOR,
            sa.Computed("to_tsvector('english'::regconfig, text)", persisted=True),
            nullable=False,
        ),
        sa.UniqueConstraint("document_id", "ordinal"),
        sa.CheckConstraint(
            "start_char >= 0 AND end_char >= start_char", name="chunks_offsets_check"
        ),
    )
    op.create_index("chunks_tsv_idx", "chunks", ["tsv"], postgresql_using="gin")
    op.create_index("chunks_collection_idx", "chunks", ["collection_id"])
    # Embedding reuse looks chunks up by the hash of their text, within a tenant.
    op.create_index("chunks_tenant_hash_idx", "chunks", ["tenant_id", "content_hash"])
    op.create_table(
        "embedding_models",
        sa.Column("id", sa.Integer, sa.Identity(), primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("version", sa.Integer, nullable=False, server_default="1"),
        sa.Column("dimension", sa.Integer, nullable=False),
        sa.Column("path", sa.Text),
        sa.Column("active", sa.Boolean, nullable=False, server_default=sa.false()),
        _timestamp("created_at"),
        sa.UniqueConstraint("name", "version"),
        sa.CheckConstraint(
            "dimension BETWEEN 1 AND 16000", name="embedding_models_dimension_check"
        ),
    )
    # At most one model serves queries at a time.
    op.create_index(
        "embedding_models_one_active_idx",
        "embedding_models",
        ["active"],
        unique=True,
        postgresql_where=sa.text("active"),
    )
    op.create_table(
        "chunk_embeddings",
        sa.Column(
            "chunk_id",
            UUID(as_uuid=True),
            sa.ForeignKey("chunks.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column(
            "model_id",
            sa.Integer,
            sa.ForeignKey("embedding_models.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        _tenant(),
        sa.Column("embedding", Vector(), nullable=False),
    )
    op.create_index("chunk_embeddings_model_idx", "chunk_embeddings", ["model_id"])
    # One HNSW (cosine) index per model: a partial expression index, because a column without a
    # fixed dimension cannot be indexed directly and models of several sizes live side by side.
    # The service calls this when it registers a model; the DDL stays here, in the migrations.
    op.execute(
        """
        CREATE FUNCTION ragservice_ensure_embedding_index(
            p_model_id integer, p_dimension integer, p_m integer, p_ef_construction integer
        ) RETURNS text LANGUAGE plpgsql AS $$
        DECLARE
            index_name text := format('chunk_embeddings_hnsw_model_%s', p_model_id);
        BEGIN
            EXECUTE format(
                'CREATE INDEX IF NOT EXISTS %I ON chunk_embeddings '
                'USING hnsw ((embedding::vector(%s)) vector_cosine_ops) '
                'WITH (m = %s, ef_construction = %s) WHERE model_id = %s',
                index_name, p_dimension, p_m, p_ef_construction, p_model_id);
            RETURN index_name;
        END $$
        """
    )
    op.create_table(
        "ingest_jobs",
        _id(),
        _tenant(),
        _collection(nullable=True),
        sa.Column("kind", sa.Text, nullable=False, server_default="cli"),
        sa.Column("status", sa.Text, nullable=False, server_default="queued"),
        _jsonb("params"),
        _jsonb("counts"),
        _jsonb("errors", "[]"),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("worker", sa.Text),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True)),
        _timestamp("created_at"),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'done', 'failed')", name="ingest_jobs_status_check"
        ),
    )
    op.create_index("ingest_jobs_status_idx", "ingest_jobs", ["status", "created_at"])


def downgrade() -> None:
    for table in (
        "ingest_jobs",
        "chunk_embeddings",
        "embedding_models",
        "chunks",
        "documents",
        "collections",
        "tenants",
    ):
        op.drop_table(table)
    op.execute("DROP FUNCTION IF EXISTS ragservice_ensure_embedding_index")
