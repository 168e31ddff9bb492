"""Vector storage per embedding model version: float32, halfvec or binary.

- `embedding_models.storage`: how the model's chunk vectors are kept and indexed.
  `float32`: `vector` in `chunk_embeddings.embedding`, an HNSW index over it (as before).
  `halfvec`: float16 in the new `chunk_embeddings.embedding_half`, an HNSW index over it
  (half the bytes, table and index alike).
  `binary`: the full `vector` in `embedding`, an HNSW index over `binary_quantize(embedding)`
  (one bit per dimension, Hamming distance); searches re-score its candidates by the exact
  cosine of the full vectors.
- `chunk_embeddings.embedding` may now be null: exactly one of the two columns holds a row's
  vector (a CHECK says so).
- `ragservice_ensure_embedding_index` takes the storage (its fifth argument, `float32` when left
  out), and still runs with the owner's rights; the index keeps its name per model, so
  `ragservice_drop_embedding_index` drops it whatever the storage.

Revision ID: 0015
Revises: 0014
Create Date: 2027-01-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import HALFVEC

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

ROLE = "ragservice_service"
SEARCH_PATH = "pg_catalog, public, pg_temp"
OLD = "ragservice_ensure_embedding_index(integer, integer, integer, integer)"
NEW = "ragservice_ensure_embedding_index(integer, integer, integer, integer, text)"

_ENSURE = """
CREATE FUNCTION ragservice_ensure_embedding_index(
    p_model_id integer, p_dimension integer, p_m integer, p_ef_construction integer,
    p_storage text DEFAULT 'float32'
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    index_name text := format('chunk_embeddings_hnsw_model_%s', p_model_id);
    expression text;
BEGIN
    expression := CASE p_storage
        WHEN 'float32' THEN format('(embedding::vector(%s)) vector_cosine_ops', p_dimension)
        WHEN 'halfvec' THEN format('(embedding_half::halfvec(%s)) halfvec_cosine_ops', p_dimension)
        WHEN 'binary' THEN format(
            '(binary_quantize(embedding::vector(%s))::bit(%s)) bit_hamming_ops',
            p_dimension, p_dimension)
    END;
    IF expression IS NULL THEN
        RAISE EXCEPTION 'unknown vector storage %', p_storage;
    END IF;
    EXECUTE format(
        'CREATE INDEX IF NOT EXISTS %I ON chunk_embeddings USING hnsw (%s) '
        'WITH (m = %s, ef_construction = %s) WHERE model_id = %s',
        index_name, expression, p_m, p_ef_construction, p_model_id);
    RETURN index_name;
END $$
"""

_ENSURE_OLD = """
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


def _definer(signature: str) -> None:
    op.execute(f"ALTER FUNCTION {signature} SECURITY DEFINER SET search_path = {SEARCH_PATH}")
    op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
    op.execute(
        f"""
        DO $$
        BEGIN
            IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{ROLE}') THEN
                GRANT EXECUTE ON FUNCTION {signature} TO {ROLE};
            END IF;
        END $$
        """
    )


def upgrade() -> None:
    op.add_column(
        "embedding_models",
        sa.Column("storage", sa.Text, nullable=False, server_default="float32"),
    )
    op.create_check_constraint(
        "embedding_models_storage_check",
        "embedding_models",
        "storage IN ('float32', 'halfvec', 'binary')",
    )
    op.add_column("chunk_embeddings", sa.Column("embedding_half", HALFVEC()))
    op.alter_column("chunk_embeddings", "embedding", nullable=True)
    op.create_check_constraint(
        "chunk_embeddings_one_vector",
        "chunk_embeddings",
        "num_nonnulls(embedding, embedding_half) = 1",
    )
    op.execute(f"DROP FUNCTION {OLD}")
    op.execute(_ENSURE)
    _definer(NEW)


def downgrade() -> None:
    # halfvec rows go back to float32 (their precision stays float16's); the indexes of those
    # models are dropped, the service rebuilds them as float32 at its next start or reembed.
    op.execute(
        "SELECT ragservice_drop_embedding_index(id) FROM embedding_models "
        "WHERE storage <> 'float32'"
    )
    op.execute(
        "UPDATE chunk_embeddings SET embedding = embedding_half::vector, embedding_half = NULL "
        "WHERE embedding_half IS NOT NULL"
    )
    op.drop_constraint("chunk_embeddings_one_vector", "chunk_embeddings")
    op.alter_column("chunk_embeddings", "embedding", nullable=False)
    op.drop_column("chunk_embeddings", "embedding_half")
    op.drop_column("embedding_models", "storage")
    op.execute(f"DROP FUNCTION {NEW}")
    op.execute(_ENSURE_OLD)
    _definer(OLD)
