"""Bulk loads build their BM25 postings blocks in C, where the extension is installed.

The append-mode branch of the insert trigger (a batch of `postings.APPEND_MIN_CHUNKS` chunks or
more: ingest, imports, re-embedding) turned a statement's tsvectors into blocks in SQL: unnest
every lexeme, compute its tier, sort all postings by (collection, lexeme, tier, seq), aggregate
three arrays per key and cut them into blocks of 128 with their bounds. The `ragservice_bm25`
extension's version 1.1 adds `ragservice_bm25_blocks(seqs, tsvectors)`, which returns the same
block rows from the same tsvectors in one pass over them and one sort of plain structs. The
trigger now uses it when the function exists; without the extension (an external PostgreSQL)
the SQL branch runs as before. The merging branch of ordinary small writes, the delete trigger
and the pack are unchanged.

The extension is updated to 1.1 here where its files offer that version (and created where it
is available but missing, as 0023 does).

Revision ID: 0025
Revises: 0024
Create Date: 2027-04-02
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

_UPDATE_EXTENSION = """
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'ragservice_bm25') THEN
        CREATE EXTENSION IF NOT EXISTS ragservice_bm25 SCHEMA public;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'ragservice_bm25' AND extversion = '1.0')
       AND EXISTS (SELECT 1 FROM pg_available_extension_versions
                   WHERE name = 'ragservice_bm25' AND version = '1.1') THEN
        ALTER EXTENSION ragservice_bm25 UPDATE TO '1.1';
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    -- the extension is not trusted: a superuser creates or updates it (docs/operators.md)
    RAISE WARNING 'ragservice_bm25 not created or updated: % is no superuser', current_user;
END $$
"""

_DOWNGRADE_EXTENSION = """
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'ragservice_bm25' AND extversion = '1.1')
    THEN
        ALTER EXTENSION ragservice_bm25 UPDATE TO '1.0';
    END IF;
END $$
"""

_APPEND = "    IF coalesce(current_setting('ragservice.postings_append', true), '') = 'on' THEN\n"

# The statement's chunks, per collection, through the C function; the totals as in 0021/0024.
_APPEND_IN_C = """    IF coalesce(current_setting('ragservice.postings_append', true), '') = 'on'
       AND to_regprocedure('ragservice_bm25_blocks(bigint[],tsvector[])') IS NOT NULL THEN
    WITH sized AS MATERIALIZED (
        SELECT s.seq, s.collection_id, v.tsv, ragservice_tsv_length(v.tsv) AS len
        FROM new_chunks s
        CROSS JOIN LATERAL (SELECT to_tsvector('english'::regconfig, s.text) OFFSET 0) AS v(tsv)
    ), totals AS (
        INSERT INTO collection_text_stats AS st (collection_id, slot, chunk_count, token_count)
        SELECT collection_id, pg_backend_pid(), count(*), coalesce(sum(len), 0)
        FROM sized GROUP BY collection_id ORDER BY collection_id
        ON CONFLICT (collection_id, slot) DO UPDATE
        SET chunk_count = st.chunk_count + EXCLUDED.chunk_count,
            token_count = st.token_count + EXCLUDED.token_count
    )
    INSERT INTO chunk_postings
        (collection_id, lexeme, tier, first_seq, last_seq, n, seqs, tfs, lengths, max_tf, min_len)
    SELECT g.collection_id, b.lexeme, b.tier, b.first_seq, b.last_seq, b.n, b.seqs, b.tfs,
           b.lengths, b.max_tf, b.min_len
    FROM (
        SELECT collection_id, array_agg(seq ORDER BY seq) AS seqs,
               array_agg(tsv ORDER BY seq) AS tsvs
        FROM sized GROUP BY collection_id
    ) AS g CROSS JOIN LATERAL ragservice_bm25_blocks(g.seqs, g.tsvs) AS b;
    ELSIF coalesce(current_setting('ragservice.postings_append', true), '') = 'on' THEN
"""


def upgrade() -> None:
    op.execute(_UPDATE_EXTENSION)
    op.execute(insert_function())


def downgrade() -> None:
    op.execute(_revision_0024().insert_function())
    op.execute(_DOWNGRADE_EXTENSION)


def insert_function() -> str:
    """The insert trigger's function as this revision defines it (`CREATE OR REPLACE`)."""
    previous = _revision_0024().insert_function()
    assert previous.count(_APPEND) == 1
    return previous.replace(_APPEND, _APPEND_IN_C)


def _revision_0024() -> ModuleType:
    """Migration 0024, whose insert trigger function this one changes."""
    path = Path(__file__).with_name("0024_postings_trigger_once.py")
    spec = importlib.util.spec_from_file_location("ragservice_migration_0024", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
