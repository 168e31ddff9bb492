"""The vectors' rows carry their chunk's readers and collection, so that a restricted or
filtered dense search can read only the vectors it may return.

A dense search for an asker who may not read every document found its candidates by walking
the HNSW graph and joining each vector to its chunk to test the chunk's readers: under a 10 %
share that walk reads about ten times the index tuples, and under 1 % it stops at
`hnsw.max_scan_tuples` before it has found them. With the readers and the collection on the
vector's own row (`chunk_embeddings.readers`, `.collection_id`, copied from the chunk), indexed
(a GIN index over the readers of restricted rows, a partial index over the unrestricted ones),
the search can instead rank exactly the vectors the asker may see (through
`ragservice_nearest_visible`, below), which it does where the planner's estimate of them says
that is cheaper than the graph walk (`retrieval.dense`).

- `chunk_embeddings.readers` (text[], NULL: the whole tenant, as `chunks.readers`) and
  `chunk_embeddings.collection_id` (uuid, NOT NULL): filled from the chunks here, set by every
  writer of vectors (`store.indexes.INSERT_STAGED`), and kept by
  `ragservice_documents_readers_changed` when a document's readers change.
- `chunk_embeddings_readers` (GIN over `readers` where it is set) and
  `chunk_embeddings_unrestricted` (btree over `model_id` where `readers` is NULL): the two arms
  of `readers IS NULL OR readers && <the asker's principals>`.
- The restrictive `document_readers` policy of chunks on the vectors too (migration 0026): a
  vector is hidden wherever its chunk is. The chunk's policy still applies to every search (each
  joins its candidates to their chunks), so the copy is an access path and a second fence.
- `ragservice_nearest_visible(model, collections, vector, limit)`: the exact ranking of the
  vectors the transaction's asker may read (`SECURITY DEFINER`, see `_NEAREST_VISIBLE`).

Filling the columns rewrites every vector's row. The models' HNSW indexes would take each new
row version in one by one (about a millisecond a row), so they are dropped for the update and
built again after it; the table is analyzed last (the planner's estimate of the visible vectors
needs the statistics of `readers`). At 100,000 vectors of 384 dimensions the update with the
index kept took 2.5 minutes here; the index's build alone takes about 36 s at that size. On a
store distributed on Citus the statements run in sequential mode, the trigger function is
rewritten again for the shards and the vectors' policy is folded into the tenant's
(`db.citus_schema`), as `ragservice db distribute` does.

Revision ID: 0034
Revises: 0033
Create Date: 2027-06-24
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

from alembic import op

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None

# Added to the readers trigger's statement (0026, with 0028's widened entries), after the
# chunks follow their document: their vectors follow too.
_CHUNKS_FOLLOW = (
    "WHERE c.document_id = changed.id AND c.readers IS DISTINCT FROM changed.readers\n    )"
)
_VECTORS_FOLLOW = """, vectors_changed AS (
        UPDATE chunk_embeddings e SET readers = changed.readers
        FROM chunks c JOIN changed ON c.document_id = changed.id
        WHERE e.chunk_id = c.id AND e.tenant_id = c.tenant_id
          AND e.readers IS DISTINCT FROM changed.readers
    )"""


def _readers_changed(vectors: bool) -> str:
    """The readers trigger's function as 0028 left it; with `vectors`, its vectors' readers
    kept too."""
    body: str = _migration("0028_writers_scope.py")._readers_changed(widened=True)
    if not vectors:
        return body
    assert body.count(_CHUNKS_FOLLOW) == 1, body
    return body.replace(_CHUNKS_FOLLOW, _CHUNKS_FOLLOW + _VECTORS_FOLLOW)


def _migration(filename: str) -> Any:
    """An earlier migration's module (its name starts with a digit: loaded by path)."""
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"ragservice_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _distributed() -> bool:
    """Whether the store was distributed on Citus (`ragservice db distribute` defines
    `ragservice_local_table`)."""
    found = (
        op.get_bind()
        .exec_driver_sql(
            "SELECT to_regprocedure('public.ragservice_local_table(name, name, text)')"
        )
        .scalar()
    )
    return found is not None


def _replace_trigger_function(vectors: bool) -> None:
    op.execute(_readers_changed(vectors))
    if _distributed():
        from ragservice.db import citus_schema, distribution

        citus_schema.rewrite_trigger_functions(
            op.get_bind().connection.driver_connection, distribution.STORE_PLAN
        )


def _add_readers_policy() -> None:
    """The vectors' restrictive policy; on a distributed store folded into the tenant's
    permissive one at once, as `ragservice db distribute` folds the others (Citus gives the
    shards every policy as a permissive one, which would widen what a restrictive one narrows)."""
    readable: str = _migration("0026_document_readers.py")._READABLE
    if not _distributed():
        op.execute(
            "CREATE POLICY document_readers ON chunk_embeddings AS RESTRICTIVE "
            f"USING ({readable}) WITH CHECK (true)"
        )
        return
    from ragservice.db import citus_schema, distribution

    # Citus refuses a subquery in a policy: the settings' functions are called directly.
    op.execute(
        "CREATE POLICY document_readers ON chunk_embeddings AS RESTRICTIVE "
        f"USING ({_direct_calls(readable)}) WITH CHECK (true)"
    )
    citus_schema.fold_restrictive_policies(
        op.get_bind().connection.driver_connection, distribution.STORE_PLAN
    )


def _direct_calls(expression: str) -> str:
    """`expression` with each `(SELECT ragservice_…())` a direct call (Citus refuses subqueries
    in the policies of distributed tables; `ragservice db distribute` rewrites them so)."""
    return re.sub(r"\(SELECT (ragservice_[a-z_]+\(\))\)", r"\1", expression)


def _drop_readers_policy() -> None:
    """The vectors' restrictive policy gone; on a distributed store, where it was folded into
    the tenant's policy, that policy as it was before."""
    if not _distributed():
        op.execute("DROP POLICY document_readers ON chunk_embeddings")
        return
    tenant = _direct_calls(_migration("0026_document_readers.py")._TENANT_POLICY)
    op.execute(
        f"ALTER POLICY tenant_isolation ON chunk_embeddings USING ({tenant}) WITH CHECK ({tenant})"
    )


# The exact ranking of the vectors a restricted asker may read. Under row-level security the
# planner may use an index only for conditions that are leakproof or the policies' own, and
# `&&` on arrays is not leakproof: the search's own `readers && <set>` could not use the GIN
# index, and the exact ranking read every vector. This function runs as the tables' owner
# (who is not subject to the policies) with the transaction's tenant and principal set taken
# from the session as the policies take them (never from its arguments), so its conditions use
# the indexes. It returns ids and distances only; the search joins them to `chunks`, whose
# policies apply there as always. Dynamic SQL: each call is planned with its own values.
_NEAREST_VISIBLE = """
CREATE FUNCTION ragservice_nearest_visible(
    p_model integer, p_collections uuid[], p_vector vector, p_limit integer
) RETURNS TABLE (chunk_id uuid, tenant_id uuid, distance float8)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public AS $$
BEGIN
    RETURN QUERY EXECUTE
        'SELECT e.chunk_id, e.tenant_id, '
        '       coalesce(e.embedding <=> $3, e.embedding_half <=> $3::halfvec)::float8 AS d '
        'FROM public.chunk_embeddings e '
        'WHERE e.model_id = $1 AND e.collection_id = ANY($2) AND e.tenant_id = $5 '
        '  AND (e.readers IS NULL OR e.readers && $6) '
        'ORDER BY d, e.chunk_id LIMIT $4'
        USING p_model, p_collections, p_vector, p_limit, ragservice_current_tenant(),
              ragservice_current_readers();
END $$;
REVOKE ALL ON FUNCTION ragservice_nearest_visible(integer, uuid[], vector, integer) FROM PUBLIC;
DO $grant$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'ragservice_service') THEN
        GRANT EXECUTE ON FUNCTION ragservice_nearest_visible(integer, uuid[], vector, integer)
            TO ragservice_service;
    END IF;
END $grant$;
"""

# The models' HNSW indexes on the vectors (migration 0007's function names them so).
_HNSW_INDEXES = """
SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_am a ON a.oid = i.relam
WHERE x.indrelid = 'public.chunk_embeddings'::regclass AND a.amname = 'hnsw'
ORDER BY 1"""


def _fill_columns() -> None:
    """Every vector's collection and readers from its chunk. Each updated row is a new row
    version, which every index of the table takes in again: the HNSW indexes are dropped for the
    update and built again after it, in bulk (an HNSW insert per row costs about a millisecond,
    a build a fraction of that)."""
    conn = op.get_bind()
    hnsw = conn.exec_driver_sql(_HNSW_INDEXES).fetchall()
    for name, _ in hnsw:
        op.execute(f'DROP INDEX public."{name}"')
    op.execute(
        "UPDATE chunk_embeddings e SET readers = c.readers, collection_id = c.collection_id "
        "FROM chunks c WHERE c.id = e.chunk_id AND c.tenant_id = e.tenant_id"
    )
    for _, definition in hnsw:
        op.execute(definition)


def _sequential_on_citus() -> None:
    """On a distributed store, this transaction's statements on distributed tables go over one
    connection per node: Citus runs a function's DDL (the trigger's) only after such
    statements, as the service's own connections to a coordinator do."""
    if _distributed():
        op.execute("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'")


def upgrade() -> None:
    _sequential_on_citus()
    op.execute("ALTER TABLE chunk_embeddings ADD COLUMN readers text[]")
    op.execute("ALTER TABLE chunk_embeddings ADD COLUMN collection_id uuid")
    _fill_columns()
    op.execute("ALTER TABLE chunk_embeddings ALTER COLUMN collection_id SET NOT NULL")
    op.execute(
        "CREATE INDEX chunk_embeddings_readers ON chunk_embeddings USING gin (readers) "
        "WHERE readers IS NOT NULL"
    )
    op.execute(
        "CREATE INDEX chunk_embeddings_unrestricted ON chunk_embeddings (model_id) "
        "WHERE readers IS NULL"
    )
    _add_readers_policy()
    _replace_trigger_function(vectors=True)
    op.execute(_NEAREST_VISIBLE)
    op.execute("ANALYZE chunk_embeddings")


def downgrade() -> None:
    _sequential_on_citus()
    op.execute("DROP FUNCTION ragservice_nearest_visible(integer, uuid[], vector, integer)")
    _replace_trigger_function(vectors=False)
    _drop_readers_policy()
    op.execute("DROP INDEX chunk_embeddings_unrestricted")
    op.execute("DROP INDEX chunk_embeddings_readers")
    op.execute("ALTER TABLE chunk_embeddings DROP COLUMN collection_id")
    op.execute("ALTER TABLE chunk_embeddings DROP COLUMN readers")
