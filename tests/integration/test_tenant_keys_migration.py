"""Migration 0030: every key of a tenant-owned table includes `tenant_id`, as Citus requires of
tables distributed by tenant; the rows written before it are carried over and back."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.exc import IntegrityError

from ragservice.db.models import Base

# The tables to be distributed by tenant (the others are shared by every tenant, or stay on
# the coordinator).
DISTRIBUTED = (
    "collections",
    "documents",
    "chunks",
    "chunk_embeddings",
    "chunk_postings",
    "collection_text_stats",
    "group_members",
    "sources",
    "source_items",
    "ingest_jobs",
    "ingest_job_items",
    "query_log",
    "feedback",
    "prompt_cache",
    "prompt_cache_sources",
)
NEW_COLUMNS = (
    "chunk_postings",
    "collection_text_stats",
    "ingest_job_items",
    "prompt_cache_sources",
)

# What Citus would refuse, read from the catalog: a table without the column, a unique index
# whose key columns lack it, a foreign key between two of the tables that lacks it on a side.
_BLOCKERS = text("""
SELECT t.relname, 'no tenant_id column', NULL
FROM pg_class t
WHERE t.relnamespace = 'public'::regnamespace AND t.relname = ANY(:tables)
  AND NOT EXISTS (SELECT 1 FROM pg_attribute a
                  WHERE a.attrelid = t.oid AND a.attname = 'tenant_id' AND NOT a.attisdropped)
UNION ALL
SELECT t.relname, 'unique index without tenant_id', i.relname
FROM pg_index x
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_class i ON i.oid = x.indexrelid
WHERE x.indisunique AND t.relnamespace = 'public'::regnamespace AND t.relname = ANY(:tables)
  AND NOT EXISTS (SELECT 1 FROM pg_attribute a
                  WHERE a.attrelid = t.oid AND a.attname = 'tenant_id'
                    AND a.attnum = ANY((x.indkey::int2[])[0:x.indnkeyatts - 1]))
UNION ALL
SELECT t.relname, 'foreign key without tenant_id', c.conname
FROM pg_constraint c
JOIN pg_class t ON t.oid = c.conrelid
JOIN pg_class p ON p.oid = c.confrelid
WHERE c.contype = 'f' AND t.relnamespace = 'public'::regnamespace
  AND t.relname = ANY(:tables) AND p.relname = ANY(:tables)
  AND NOT (EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = t.oid
                     AND a.attname = 'tenant_id' AND a.attnum = ANY(c.conkey))
           AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = p.oid
                         AND a.attname = 'tenant_id' AND a.attnum = ANY(c.confkey)))
ORDER BY 1, 2, 3
""")

_PRIMARY_KEYS = text("""
SELECT t.relname, array_agg(a.attname ORDER BY k.n)
FROM pg_constraint c
JOIN pg_class t ON t.oid = c.conrelid
CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, n)
JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
WHERE c.contype = 'p' AND t.relnamespace = 'public'::regnamespace AND t.relname = ANY(:tables)
GROUP BY t.relname
""")

_KEY_DEFINITIONS = text("""
SELECT i.relname, pg_get_indexdef(x.indexrelid)
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
WHERE x.indisunique AND t.relname = ANY(:tables) AND t.relnamespace = 'public'::regnamespace
""")
_FOREIGN_KEYS = text("""
SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
WHERE contype = 'f' AND conrelid::regclass::text = ANY(:tables)
""")


def test_every_key_of_the_tenant_tables_includes_tenant_id(database_url: str) -> None:
    """At head the catalog shows nothing Citus would refuse in the tables' keys, and the models
    declare the same primary keys as the catalog."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            blockers = conn.execute(_BLOCKERS, {"tables": list(DISTRIBUTED)}).all()
            primary_keys = dict(conn.execute(_PRIMARY_KEYS, {"tables": list(DISTRIBUTED)}).all())
    finally:
        engine.dispose()
    assert [tuple(row) for row in blockers] == []
    modelled = {
        table: [column.name for column in Base.metadata.tables[table].primary_key.columns]
        for table in DISTRIBUTED
    }
    assert primary_keys == modelled


@pytest.fixture
def owner(database_url: str) -> Iterator[Connection]:
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


def _migrate(conn: Connection, direction: str, target: str) -> None:
    from alembic import command

    from ragservice.db import migrate

    config = migrate.alembic_config()
    config.attributes["connection"] = conn
    getattr(command, direction)(config, target)
    conn.commit()


class Ids:
    def __init__(self) -> None:
        self.tenants = [uuid.uuid4(), uuid.uuid4()]
        self.collections = [uuid.uuid4(), uuid.uuid4()]
        self.documents = [uuid.uuid4(), uuid.uuid4()]
        self.jobs = [uuid.uuid4(), uuid.uuid4()]
        self.entries = [uuid.uuid4(), uuid.uuid4()]
        self.queries = [uuid.uuid4(), uuid.uuid4()]
        self.sources = [uuid.uuid4(), uuid.uuid4()]


_TEXTS = (
    "the quick brown fox jumps over the lazy dog",
    "a tenant owns its collections, documents and chunks",
    "postings blocks carry the tenant of their collection",
)


def _seed(conn: Connection, ids: Ids) -> None:
    """Two tenants' rows in every table, written as revision 0029 has them (as the owner: no
    row-level security)."""
    model = conn.execute(
        text(
            "INSERT INTO embedding_models (name, version, dimension) "
            "VALUES ('tenant-keys-test', 1, 3) RETURNING id"
        )
    ).scalar_one()
    for n in range(2):
        values: dict[str, Any] = {
            "tenant": ids.tenants[n],
            "collection": ids.collections[n],
            "document": ids.documents[n],
            "job": ids.jobs[n],
            "entry": ids.entries[n],
            "query": ids.queries[n],
            "source": ids.sources[n],
            "model": model,
            "name": f"tenant-keys-{n}",
        }
        for statement in (
            "INSERT INTO tenants (id, name) VALUES (:tenant, :name)",
            "INSERT INTO collections (id, tenant_id, name) VALUES (:collection, :tenant, :name)",
            "INSERT INTO documents (id, tenant_id, collection_id, external_id, content_hash) "
            "VALUES (:document, :tenant, :collection, 'doc', 'h')",
            "INSERT INTO group_members (tenant_id, group_name, user_name) "
            "VALUES (:tenant, 'staff', 'ana')",
            "INSERT INTO sources (id, tenant_id, collection_id, kind, location) "
            "VALUES (:source, :tenant, :collection, 'web', 'https://example.org/')",
            "INSERT INTO source_items (source_id, key, tenant_id) VALUES (:source, 'k', :tenant)",
            "INSERT INTO ingest_jobs (id, tenant_id, collection_id, source_id, status) "
            "VALUES (:job, :tenant, :collection, :source, 'queued')",
            "INSERT INTO ingest_job_items (job_id, ordinal, kind, name, body) "
            "VALUES (:job, 0, 'text', 'a', 'x'), (:job, 1, 'text', 'b', 'y')",
            "INSERT INTO query_log (id, tenant_id, endpoint, question, status) "
            "VALUES (:query, :tenant, 'query', 'why?', 'ok')",
            "INSERT INTO feedback (query_id, tenant_id, rating) VALUES (:query, :tenant, 1)",
            "INSERT INTO prompt_cache (id, tenant_id, scope, model_id, collection_ids, "
            "prompt_hash, prompt, embedding, answer, response, expires_at, source_documents) "
            "VALUES (:entry, :tenant, :name, :model, ARRAY[CAST(:collection AS uuid)], 'p', "
            "'why?', '[1,0,0]', 'because', '{}', now() + interval '1 hour', "
            "ARRAY[CAST(:document AS uuid)])",
            "INSERT INTO prompt_cache_sources (entry_id, document_id, document_version) "
            "VALUES (:entry, :document, 1)",
        ):
            conn.execute(text(statement), values)
        _add_chunks(conn, ids, n, ordinals=range(len(_TEXTS)))
        conn.execute(
            text(
                "INSERT INTO chunk_embeddings (chunk_id, model_id, tenant_id, embedding) "
                "SELECT id, :model, tenant_id, '[0,1,0]' FROM chunks WHERE document_id = :document"
            ),
            {"model": model, "document": ids.documents[n]},
        )
    conn.commit()


def _add_chunks(conn: Connection, ids: Ids, n: int, ordinals: range) -> None:
    """Chunks of tenant n's document, in one statement (the postings triggers run once)."""
    conn.execute(
        text(
            "INSERT INTO chunks (id, tenant_id, collection_id, document_id, ordinal, text, "
            "token_count, content_hash, start_char, end_char) "
            "SELECT gen_random_uuid(), :tenant, :collection, :document, o, "
            "(CAST(:texts AS text[]))[o % 3 + 1], 9, 'h', 0, 1 "
            "FROM unnest(CAST(:ordinals AS int[])) AS o"
        ),
        {
            "tenant": ids.tenants[n],
            "collection": ids.collections[n],
            "document": ids.documents[n],
            "texts": list(_TEXTS),
            "ordinals": list(ordinals),
        },
    )


def _digests(conn: Connection) -> dict[str, str]:
    """Every row of every tenant table (with the columns the revision has), one digest a table."""
    digest = "SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM {} t"
    return {table: conn.execute(text(digest.format(table))).scalar_one() for table in DISTRIBUTED}


def _tenants(conn: Connection, table: str) -> dict[uuid.UUID, int]:
    rows = conn.execute(text(f"SELECT tenant_id, count(*) FROM {table} GROUP BY tenant_id"))
    return {row[0]: row[1] for row in rows}


_BM25_STATE = text("""
SELECT (SELECT sum(chunk_count) FROM collection_text_stats WHERE collection_id = :c),
       (SELECT sum(token_count) FROM collection_text_stats WHERE collection_id = :c),
       (SELECT count(DISTINCT lexeme) FROM chunk_postings WHERE collection_id = :c),
       (SELECT sum(n) FROM chunk_postings WHERE collection_id = :c)
""")
# The same, computed from the collection's chunks.
_BM25_EXPECTED = text("""
WITH v AS (SELECT to_tsvector('english', text) AS tsv FROM chunks WHERE collection_id = :c)
SELECT count(*), sum(ragservice_tsv_length(tsv)),
       (SELECT count(DISTINCT l) FROM v, unnest(tsvector_to_array(v.tsv)) AS l),
       sum(length(tsv))
FROM v
""")


def _assert_bm25_exact(conn: Connection, ids: Ids) -> None:
    """Each collection's BM25 totals and postings are those of its chunks."""
    for collection in ids.collections:
        state = tuple(conn.execute(_BM25_STATE, {"c": collection}).one())
        assert state == tuple(conn.execute(_BM25_EXPECTED, {"c": collection}).one())


_MISMATCHED_TENANTS = text("""
SELECT (SELECT count(*) FROM chunk_postings p JOIN collections c ON c.id = p.collection_id
        WHERE p.tenant_id <> c.tenant_id)
     + (SELECT count(*) FROM collection_text_stats s
        JOIN collections c ON c.id = s.collection_id WHERE s.tenant_id <> c.tenant_id)
     + (SELECT count(*) FROM ingest_job_items i JOIN ingest_jobs j ON j.id = i.job_id
        WHERE i.tenant_id <> j.tenant_id)
     + (SELECT count(*) FROM prompt_cache_sources s JOIN prompt_cache e ON e.id = s.entry_id
        WHERE s.tenant_id <> e.tenant_id)
""")


def test_migration_0030_carries_rows_over_and_back(owner: Connection) -> None:
    conn = owner
    ids = Ids()
    _migrate(conn, "downgrade", "0029")
    _seed(conn, ids)
    _assert_bm25_exact(conn, ids)
    before = _digests(conn)

    _migrate(conn, "upgrade", "head")
    # the new columns hold their parents' tenants
    for table in NEW_COLUMNS:
        counts = _tenants(conn, table)
        assert all(counts.get(tenant, 0) > 0 for tenant in ids.tenants), table
    assert conn.execute(_MISMATCHED_TENANTS).scalar_one() == 0
    keys = dict(conn.execute(_KEY_DEFINITIONS, {"tables": list(DISTRIBUTED)}).all())
    assert keys["collections_pkey"].endswith(" (id, tenant_id)")
    assert keys["chunk_postings_pkey"].endswith(
        " (collection_id, lexeme, tier, first_seq, tenant_id) "
        "INCLUDE (last_seq, n, max_tf, min_len)"
    )
    assert keys["ingest_jobs_one_run_per_source"].endswith(
        " (source_id, tenant_id) WHERE (status = ANY (ARRAY['queued'::text, 'running'::text]))"
    )
    foreign_keys = dict(conn.execute(_FOREIGN_KEYS, {"tables": list(DISTRIBUTED)}).all())
    assert foreign_keys["chunks_document_id_fkey"] == (
        "FOREIGN KEY (document_id, tenant_id) REFERENCES documents(id, tenant_id) ON DELETE CASCADE"
    )
    assert foreign_keys["ingest_jobs_source_id_fkey"] == (
        "FOREIGN KEY (source_id, tenant_id) REFERENCES sources(id, tenant_id) "
        "ON DELETE SET NULL (source_id)"
    )
    _assert_bm25_exact(conn, ids)

    # down again: the columns go, and every row is as it was
    _migrate(conn, "downgrade", "0029")
    columns = conn.execute(
        text(
            "SELECT table_name FROM information_schema.columns "
            "WHERE table_schema = 'public' AND column_name = 'tenant_id' "
            "AND table_name = ANY(:tables)"
        ),
        {"tables": list(NEW_COLUMNS)},
    ).all()
    assert columns == []
    assert _digests(conn) == before

    # up once more: the triggers (merging into open blocks) and the pack write the tenant
    _migrate(conn, "upgrade", "head")
    _add_chunks(conn, ids, 0, ordinals=range(3, 6))
    conn.execute(text("SELECT ragservice_pack_postings(:c)"), {"c": ids.collections[0]})
    conn.execute(
        text("DELETE FROM chunks WHERE document_id = :d AND ordinal = 4"), {"d": ids.documents[0]}
    )
    conn.commit()
    _assert_bm25_exact(conn, ids)
    assert conn.execute(_MISMATCHED_TENANTS).scalar_one() == 0

    # and down: the restored triggers write postings and totals without it
    _migrate(conn, "downgrade", "0029")
    _assert_bm25_exact(conn, ids)
    _add_chunks(conn, ids, 1, ordinals=range(3, 5))
    conn.execute(
        text("DELETE FROM chunks WHERE document_id = :d AND ordinal = 0"), {"d": ids.documents[1]}
    )
    conn.commit()
    _assert_bm25_exact(conn, ids)
    _migrate(conn, "upgrade", "head")
    assert conn.execute(_MISMATCHED_TENANTS).scalar_one() == 0


def test_keys_hold_rows_to_their_tenant(owner: Connection) -> None:
    """A row cannot name another tenant's parent; a deleted source leaves its runs their
    tenant."""
    conn = owner
    ids = Ids()
    _migrate(conn, "downgrade", "0029")
    _seed(conn, ids)
    _migrate(conn, "upgrade", "head")
    with pytest.raises(IntegrityError, match="documents_collection_id_fkey"):
        conn.execute(
            text(
                "INSERT INTO documents (tenant_id, collection_id, external_id, content_hash) "
                "VALUES (:tenant, :collection, 'stray', 'h')"
            ),
            {"tenant": ids.tenants[1], "collection": ids.collections[0]},
        )
    conn.rollback()
    conn.execute(text("DELETE FROM sources WHERE id = :s"), {"s": ids.sources[0]})
    job = conn.execute(
        text("SELECT source_id, tenant_id FROM ingest_jobs WHERE id = :j"), {"j": ids.jobs[0]}
    ).one()
    assert tuple(job) == (None, ids.tenants[0])
    items = text("SELECT count(*) FROM source_items WHERE source_id = :s")
    assert conn.execute(items, {"s": ids.sources[0]}).scalar_one() == 0
    conn.rollback()
