"""Every key of the tenant-owned tables includes `tenant_id`, so they can be distributed by
tenant (Citus).

Citus splits a distributed table into shards by one column and co-locates the tables split by
the same one. It then enforces a primary key or a unique constraint only when that column is
part of it (each shard checks its own rows), and a foreign key between two distributed tables
only when both sides include it (the two rows then live in one shard group). The tenant-owned
tables (collections, documents, chunks, chunk_embeddings, chunk_postings,
collection_text_stats, group_members, sources, source_items, ingest_jobs, ingest_job_items,
query_log, feedback, prompt_cache, prompt_cache_sources) are to be distributed by `tenant_id`:

- `tenant_id uuid NOT NULL` on the four that had none, from their parent row: `chunk_postings`
  and `collection_text_stats` (the collection's), `ingest_job_items` (the job's),
  `prompt_cache_sources` (the cache entry's). Their row-level-security policy is now the tenant
  policy of the others (`tenant_id = (SELECT ragservice_current_tenant()) OR (SELECT
  ragservice_all_tenants())`) instead of a look-up of the parent (`collection_id IN (SELECT id
  FROM collections)`, 0007 and 0014). Backfilling rewrites every postings block once; the next
  `ragservice db optimize` (or autovacuum) reclaims the old versions.
- `tenant_id` is appended, last, to every primary key and unique constraint or index of those
  tables that lacked it (`KEYS`: collections (id) → (id, tenant_id), documents (collection_id,
  external_id) → (collection_id, external_id, tenant_id), chunk_postings (collection_id,
  lexeme, tier, first_seq) INCLUDE (…) → (…, first_seq, tenant_id) INCLUDE (…), the partial
  ingest_jobs_one_run_per_source (source_id) → (source_id, tenant_id) with the same WHERE, …).
  The names stay, and each replaces the old index: a lookup by the leading columns reads the
  same index as before. What is unique does not change in practice: ids are random uuids or
  identity values, and every other key leads with a row of one tenant (a collection, a document,
  a chunk, a job, a source, a cache entry) or a cache scope that names the tenant.
- Every foreign key between two of those tables is composite, with `tenant_id` on both sides
  (`FOREIGN_KEYS`: chunks (collection_id, tenant_id) → collections (id, tenant_id), …), so a row
  can no longer point at another tenant's row. Names and ON DELETE actions stay; the job's
  source becomes `ON DELETE SET NULL (source_id)`, which leaves the job its tenant. Foreign keys
  to the tables every tenant shares (tenants, embedding_models) stay as they are.
- The postings triggers' functions (0021, 0024, 0025) and the pack (0021, 0022) write the
  chunks' `tenant_id` into the blocks and totals rows they insert, and name the new keys in
  their ON CONFLICT; the store writes it into job items and cache sources.

The downgrade restores the earlier functions, foreign keys, keys and policies, and drops the four
columns.

Revision ID: 0030
Revises: 0029
Create Date: 2027-06-15
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, NamedTuple

from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

TENANT = "tenant_id"
_TENANT_POLICY = (
    "tenant_id = (SELECT ragservice_current_tenant()) OR (SELECT ragservice_all_tenants())"
)

# table → (its parent, the column naming the parent row): where its tenant_id comes from.
NEW_COLUMNS: dict[str, tuple[str, str]] = {
    "chunk_postings": ("collections", "collection_id"),
    "collection_text_stats": ("collections", "collection_id"),
    "ingest_job_items": ("ingest_jobs", "job_id"),
    "prompt_cache_sources": ("prompt_cache", "entry_id"),
}


class Key(NamedTuple):
    """A primary key, unique constraint or (`constraint` False) unique index, before this
    revision: `columns`, then `tail` (an INCLUDE list, an index's WHERE)."""

    table: str
    name: str
    columns: str
    kind: str = "PRIMARY KEY"
    tail: str = ""
    constraint: bool = True

    def definition(self, columns: str) -> str:
        if self.constraint:
            return (
                f"ALTER TABLE {self.table} DROP CONSTRAINT {self.name}, "
                f"ADD CONSTRAINT {self.name} {self.kind} ({columns}){self.tail}"
            )
        return f"CREATE UNIQUE INDEX {self.name} ON {self.table} ({columns}){self.tail}"


KEYS = (
    Key("collections", "collections_pkey", "id"),
    Key("documents", "documents_pkey", "id"),
    Key(
        "documents",
        "documents_collection_id_external_id_key",
        "collection_id, external_id",
        "UNIQUE",
    ),
    Key("chunks", "chunks_pkey", "id"),
    Key("chunks", "chunks_document_id_ordinal_key", "document_id, ordinal", "UNIQUE"),
    Key("chunks", "chunks_seq_key", "seq", constraint=False),
    Key("chunk_embeddings", "chunk_embeddings_pkey", "chunk_id, model_id"),
    Key(
        "chunk_postings",
        "chunk_postings_pkey",
        "collection_id, lexeme, tier, first_seq",
        tail=" INCLUDE (last_seq, n, max_tf, min_len)",
    ),
    Key("collection_text_stats", "collection_text_stats_pkey", "collection_id, slot"),
    Key("sources", "sources_pkey", "id"),
    Key("sources", "sources_collection_location_key", "collection_id, location", "UNIQUE"),
    Key("source_items", "source_items_pkey", "source_id, key"),
    Key("ingest_jobs", "ingest_jobs_pkey", "id"),
    Key(
        "ingest_jobs",
        "ingest_jobs_one_run_per_source",
        "source_id",
        tail=" WHERE status IN ('queued', 'running')",
        constraint=False,
    ),
    Key("ingest_job_items", "ingest_job_items_pkey", "job_id, ordinal"),
    Key("query_log", "query_log_pkey", "id"),
    Key("feedback", "feedback_pkey", "id"),
    Key("prompt_cache", "prompt_cache_pkey", "id"),
    Key(
        "prompt_cache",
        "prompt_cache_scope_prompt_sources_key",
        "scope, prompt_hash, source_documents, built_for",
        "UNIQUE",
    ),
    Key("prompt_cache_sources", "prompt_cache_sources_pkey", "entry_id, document_id"),
)


class ForeignKey(NamedTuple):
    """A foreign key from `table.column` to `parent.id`, before this revision."""

    table: str
    name: str
    column: str
    parent: str
    on_delete: str = "CASCADE"

    def definition(self, with_tenant: bool) -> str:
        add = f"ALTER TABLE {self.table} ADD CONSTRAINT {self.name} FOREIGN KEY "
        if not with_tenant:
            return add + f"({self.column}) REFERENCES {self.parent} (id) ON DELETE {self.on_delete}"
        # SET NULL: only the reference is cleared, never the row's tenant (PostgreSQL 15+).
        action = f"SET NULL ({self.column})" if self.on_delete == "SET NULL" else self.on_delete
        return add + (
            f"({self.column}, {TENANT}) REFERENCES {self.parent} (id, {TENANT}) ON DELETE {action}"
        )


FOREIGN_KEYS = (
    ForeignKey("documents", "documents_collection_id_fkey", "collection_id", "collections"),
    ForeignKey("chunks", "chunks_collection_id_fkey", "collection_id", "collections"),
    ForeignKey("chunks", "chunks_document_id_fkey", "document_id", "documents"),
    ForeignKey("chunk_embeddings", "chunk_embeddings_chunk_id_fkey", "chunk_id", "chunks"),
    ForeignKey(
        "chunk_postings", "chunk_postings_collection_id_fkey", "collection_id", "collections"
    ),
    ForeignKey(
        "collection_text_stats",
        "collection_text_stats_collection_id_fkey",
        "collection_id",
        "collections",
    ),
    ForeignKey("sources", "sources_collection_id_fkey", "collection_id", "collections"),
    ForeignKey("source_items", "source_items_source_id_fkey", "source_id", "sources"),
    ForeignKey("ingest_jobs", "ingest_jobs_collection_id_fkey", "collection_id", "collections"),
    ForeignKey("ingest_jobs", "ingest_jobs_source_id_fkey", "source_id", "sources", "SET NULL"),
    ForeignKey("ingest_job_items", "ingest_job_items_job_id_fkey", "job_id", "ingest_jobs"),
    ForeignKey("feedback", "feedback_query_id_fkey", "query_id", "query_log"),
    ForeignKey(
        "prompt_cache_sources", "prompt_cache_sources_entry_id_fkey", "entry_id", "prompt_cache"
    ),
)

# -- the functions that insert postings blocks and totals rows --------------------------------
# Each change: (text before, text after, how many times the insert trigger's, the delete
# trigger's and the pack's function hold it). The chunks' tenant_id is carried along with their
# collection; grouped by collection, the rows of a group share one tenant (the collection's, by
# the foreign keys), which `any_value` takes without widening the grouping.

_TOTALS = "INSERT INTO collection_text_stats AS st (collection_id, slot, chunk_count, token_count)"
_CHANGES: tuple[tuple[str, str, tuple[int, int, int]], ...] = (
    # the statement's chunks (`sized`, `gone`) with their tenant
    (
        "SELECT s.seq, s.collection_id, v.tsv,",
        "SELECT s.seq, s.collection_id, s.tenant_id, v.tsv,",
        (3, 0, 0),
    ),
    (
        "SELECT o.seq, o.collection_id, v.tsv,",
        "SELECT o.seq, o.collection_id, o.tenant_id, v.tsv,",
        (0, 1, 0),
    ),
    # a backend's totals row of each collection (trigger), slot 0 (pack)
    (
        f"{_TOTALS}\n        SELECT collection_id, pg_backend_pid(),",
        "INSERT INTO collection_text_stats AS st\n"
        "            (collection_id, tenant_id, slot, chunk_count, token_count)\n"
        "        SELECT collection_id, any_value(tenant_id), pg_backend_pid(),",
        (3, 1, 0),
    ),
    (
        f"{_TOTALS}\n    SELECT target, 0,",
        "INSERT INTO collection_text_stats AS st\n"
        "        (collection_id, tenant_id, slot, chunk_count, token_count)\n"
        "    SELECT target, any_value(tenant_id), 0,",
        (0, 0, 1),
    ),
    (
        "RETURNING s.chunk_count, s.token_count",
        "RETURNING s.tenant_id, s.chunk_count, s.token_count",
        (0, 0, 1),
    ),
    (
        "ON CONFLICT (collection_id, slot) DO UPDATE",
        "ON CONFLICT (collection_id, slot, tenant_id) DO UPDATE",
        (3, 1, 1),
    ),
    # postings blocks: built by the C function (append mode with the extension) ...
    (
        "SELECT collection_id, array_agg(seq ORDER BY seq) AS seqs,",
        "SELECT collection_id, any_value(tenant_id) AS tenant_id,\n"
        "               array_agg(seq ORDER BY seq) AS seqs,",
        (1, 0, 0),
    ),
    (
        "SELECT g.collection_id, b.lexeme,",
        "SELECT g.collection_id, g.tenant_id, b.lexeme,",
        (1, 0, 0),
    ),
    # ... or in SQL, from the fresh postings and those of the open blocks taken (trigger) ...
    (
        'SELECT s.collection_id, t.lexeme COLLATE "C" AS lexeme,',
        'SELECT s.collection_id, s.tenant_id, t.lexeme COLLATE "C" AS lexeme,',
        (2, 0, 0),
    ),
    (
        "RETURNING p.collection_id, p.lexeme, p.tier, p.seqs, p.tfs, p.lengths",
        "RETURNING p.collection_id, p.tenant_id, p.lexeme, p.tier, p.seqs, p.tfs, p.lengths",
        (1, 0, 0),
    ),
    (
        "SELECT collection_id, lexeme, tier, seq, tf, len FROM fresh",
        "SELECT collection_id, tenant_id, lexeme, tier, seq, tf, len FROM fresh",
        (1, 0, 0),
    ),
    (
        "SELECT o.collection_id, o.lexeme, o.tier, u.seq, u.tf, u.len",
        "SELECT o.collection_id, o.tenant_id, o.lexeme, o.tier, u.seq, u.tf, u.len",
        (1, 0, 0),
    ),
    (
        "SELECT collection_id, lexeme, tier, count(*)::integer AS n,",
        "SELECT collection_id, any_value(tenant_id) AS tenant_id, lexeme, tier,\n"
        "               count(*)::integer AS n,",
        (2, 0, 0),
    ),
    (
        "SELECT k.collection_id, k.lexeme, k.tier, k.seqs[b.lo],",
        "SELECT k.collection_id, k.tenant_id, k.lexeme, k.tier, k.seqs[b.lo],",
        (2, 0, 0),
    ),
    # ... or by the pack, from the short blocks it takes
    (
        "RETURNING p.lexeme, p.tier, p.seqs, p.tfs, p.lengths",
        "RETURNING p.tenant_id, p.lexeme, p.tier, p.seqs, p.tfs, p.lengths",
        (0, 0, 1),
    ),
    (
        "SELECT t.lexeme, t.tier, count(*)::integer AS n,",
        "SELECT any_value(t.tenant_id) AS tenant_id, t.lexeme, t.tier, count(*)::integer AS n,",
        (0, 0, 1),
    ),
    (
        "SELECT target, k.lexeme, k.tier,",
        "SELECT target, k.tenant_id, k.lexeme, k.tier,",
        (0, 0, 1),
    ),
    (
        "(collection_id, lexeme, tier, first_seq, last_seq, n, seqs, tfs, lengths,",
        "(collection_id, tenant_id, lexeme, tier, first_seq, last_seq, n, seqs, tfs, lengths,",
        (3, 0, 1),
    ),
)


def _migration(filename: str) -> Any:
    """An earlier migration's module (its name starts with a digit: loaded by path)."""
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"ragservice_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def previous_functions() -> tuple[str, str, str]:
    """The insert trigger's (0025), the delete trigger's (0024) and the pack's (0022)
    functions as revision 0029 has them, each a `CREATE OR REPLACE FUNCTION`."""
    insert: str = _migration("0025_postings_blocks_in_c.py").insert_function()
    once = _migration("0024_postings_trigger_once.py")
    delete: str = once._changed(once._revision_0021()._DELETE, once._DELETE_ONCE, count=1)
    pack_0022 = _migration("0022_pack_without_nested_loops.py")
    pack: str = pack_0022._pack(pack_0022._revision_0021()._PACK)
    assert pack.count("CREATE FUNCTION") == 1
    return insert, delete, pack.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")


def functions() -> tuple[str, str, str]:
    """The same three functions as this revision defines them."""
    changed = []
    for index, definition in enumerate(previous_functions()):
        for old, new, counts in _CHANGES:
            assert definition.count(old) == counts[index], (index, old)
            definition = definition.replace(old, new)
        changed.append(definition)
    insert, delete, pack = changed
    return insert, delete, pack


def upgrade() -> None:
    for table, (parent, column) in NEW_COLUMNS.items():
        op.execute(f"ALTER TABLE {table} ADD COLUMN {TENANT} uuid")
        op.execute(
            f"UPDATE {table} t SET {TENANT} = p.tenant_id FROM {parent} p WHERE p.id = t.{column}"
        )
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {TENANT} SET NOT NULL")
        op.execute(f"DROP POLICY tenant_isolation ON {table}")
        op.execute(f"CREATE POLICY tenant_isolation ON {table} USING ({_TENANT_POLICY})")
    for definition in functions():
        op.execute(definition)
    for foreign_key in FOREIGN_KEYS:
        op.execute(f"ALTER TABLE {foreign_key.table} DROP CONSTRAINT {foreign_key.name}")
    for key in KEYS:
        if not key.constraint:
            op.execute(f"DROP INDEX {key.name}")
        op.execute(key.definition(f"{key.columns}, {TENANT}"))
    for foreign_key in FOREIGN_KEYS:
        op.execute(foreign_key.definition(with_tenant=True))


def downgrade() -> None:
    for definition in previous_functions():
        op.execute(definition)
    for foreign_key in FOREIGN_KEYS:
        op.execute(f"ALTER TABLE {foreign_key.table} DROP CONSTRAINT {foreign_key.name}")
    for key in KEYS:
        if not key.constraint:
            op.execute(f"DROP INDEX {key.name}")
        op.execute(key.definition(key.columns))
    for foreign_key in FOREIGN_KEYS:
        op.execute(foreign_key.definition(with_tenant=False))
    policies = {
        **_migration("0007_row_level_security.py").POLICIES,
        "chunk_postings": _migration("0014_compact_postings.py").POLICY,
    }
    for table in NEW_COLUMNS:
        op.execute(f"DROP POLICY tenant_isolation ON {table}")
        op.execute(f"CREATE POLICY tenant_isolation ON {table} USING ({policies[table]})")
        op.execute(f"ALTER TABLE {table} DROP COLUMN {TENANT}")
