"""A bulk write path for the BM25 postings: append-only blocks packed once, totals without turns.

- `collection_text_stats` holds several rows per collection, one per writing backend (`slot`,
  the backend's pid; 0: the totals folded by a pack). Readers sum a collection's rows. Writers
  never update another backend's row, so loaders of one collection no longer take turns on it.
- Writers that rewrite existing postings blocks (an ordinary insert merging into a key's open
  block, a delete, a pack) serialise per collection on a transaction advisory lock
  (`ragservice_lock_postings`, taken in collection order: never a deadlock between them).
- Append mode: a transaction that sets `ragservice.postings_append = on` (`SET LOCAL`; the store
  does for large batches) inserts its postings as new blocks without merging into open blocks
  and without the lock: several loaders into one collection run their trigger work
  (`to_tsvector`, grouping, block writes) side by side, each in its own backend. A key may then
  have several short blocks, whose seq ranges may overlap.
- `ragservice_pack_postings(collection)` merges each key's short blocks into blocks of 128
  (ordered by seq; `max_tf`/`min_len` recomputed), one lexeme range at a time, and folds the
  collection's totals rows that no live transaction holds into slot 0. Bulk loads run it at
  their end.
- The delete trigger finds the block that holds a deleted seq exactly (`seq = ANY(seqs)`), not
  by range alone: blocks of one key may overlap in range.

Revision ID: 0021
Revises: 0020
Create Date: 2027-03-01
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

# The (class, object) form of advisory locks lives apart from the bigint form used elsewhere.
_LOCK = """
CREATE FUNCTION ragservice_lock_postings(ids uuid[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    k integer;
BEGIN
    FOR k IN SELECT DISTINCT hashtext(i::text) FROM unnest(ids) AS i ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock(2921, k);
    END LOOP;
END $$
"""

# A statement's fresh postings, pooled (when merging) with those of the keys' open blocks, then
# cut into blocks of 128 by seq. `{opened}`: the CTE that takes the open blocks, or none.
_POSTINGS = """
    WITH sized AS MATERIALIZED (
        SELECT s.seq, s.collection_id, v.tsv, ragservice_tsv_length(v.tsv) AS len
        FROM new_chunks s
        CROSS JOIN LATERAL (SELECT to_tsvector('english'::regconfig, s.text)) AS v(tsv)
    ), totals AS (
        INSERT INTO collection_text_stats AS st (collection_id, slot, chunk_count, token_count)
        SELECT collection_id, pg_backend_pid(), count(*), coalesce(sum(len), 0)
        FROM sized GROUP BY collection_id ORDER BY collection_id
        ON CONFLICT (collection_id, slot) DO UPDATE
        SET chunk_count = st.chunk_count + EXCLUDED.chunk_count,
            token_count = st.token_count + EXCLUDED.token_count
    ), fresh AS MATERIALIZED (
        SELECT s.collection_id, t.lexeme, ragservice_bm25_tier(f.tf, s.len) AS tier,
               s.seq, f.tf, s.len
        FROM sized s CROSS JOIN LATERAL unnest(s.tsv) AS t
        CROSS JOIN LATERAL (SELECT coalesce(array_length(t.positions, 1), 1)) AS f(tf)
    ){opened}, keyed AS (
        SELECT collection_id, lexeme, tier, count(*)::integer AS n,
               array_agg(seq ORDER BY seq) AS seqs, array_agg(tf::smallint ORDER BY seq) AS tfs,
               array_agg(len ORDER BY seq) AS lengths
        FROM {pooled} GROUP BY collection_id, lexeme, tier
    )
    INSERT INTO chunk_postings
        (collection_id, lexeme, tier, first_seq, last_seq, n, seqs, tfs, lengths, max_tf, min_len)
    SELECT k.collection_id, k.lexeme, k.tier, k.seqs[b.lo], k.seqs[h.hi], h.hi - b.lo + 1,
           k.seqs[b.lo:h.hi], k.tfs[b.lo:h.hi], k.lengths[b.lo:h.hi], m.max_tf, m.min_len
    FROM keyed k CROSS JOIN LATERAL generate_series(1, k.n, 128) AS b(lo)
    CROSS JOIN LATERAL (SELECT least(b.lo + 127, k.n)) AS h(hi)
    CROSS JOIN LATERAL (
        SELECT max(u.tf) AS max_tf, min(u.len) AS min_len
        FROM unnest(k.tfs[b.lo:h.hi], k.lengths[b.lo:h.hi]) AS u(tf, len)
    ) AS m;
"""

_OPENED = """, opened AS (
        DELETE FROM chunk_postings p
        USING (SELECT DISTINCT collection_id, lexeme, tier FROM fresh) AS k
        WHERE p.collection_id = k.collection_id AND p.lexeme = k.lexeme AND p.tier = k.tier
          AND p.n < 128
        RETURNING p.collection_id, p.lexeme, p.tier, p.seqs, p.tfs, p.lengths
    ), pooled AS (
        SELECT collection_id, lexeme, tier, seq, tf, len FROM fresh
        UNION ALL
        SELECT o.collection_id, o.lexeme, o.tier, u.seq, u.tf, u.len
        FROM opened o CROSS JOIN LATERAL unnest(o.seqs, o.tfs, o.lengths) AS u(seq, tf, len)
    )"""

_INSERT = f"""
CREATE OR REPLACE FUNCTION ragservice_chunk_postings_insert() RETURNS trigger
LANGUAGE plpgsql SET work_mem = '64MB' AS $$
BEGIN
    IF coalesce(current_setting('ragservice.postings_append', true), '') = 'on' THEN
{_POSTINGS.format(opened="", pooled="fresh")}
    ELSE
        PERFORM ragservice_lock_postings(ARRAY(SELECT DISTINCT collection_id FROM new_chunks));
{_POSTINGS.format(opened=_OPENED, pooled="pooled")}
    END IF;
    RETURN NULL;
END $$
"""

# Chunks of a collection being deleted are skipped: their postings and totals go with the
# collection (foreign keys). The block of a deleted posting is the one of its key that holds
# its seq (blocks of a key may overlap in range once loaders append side by side).
_DELETE = """
CREATE OR REPLACE FUNCTION ragservice_chunk_postings_delete() RETURNS trigger
LANGUAGE plpgsql SET work_mem = '64MB' AS $$
BEGIN
    PERFORM ragservice_lock_postings(ARRAY(SELECT DISTINCT collection_id FROM old_chunks));
    WITH gone AS MATERIALIZED (
        SELECT o.seq, o.collection_id, v.tsv, ragservice_tsv_length(v.tsv) AS len
        FROM old_chunks o
        CROSS JOIN LATERAL (SELECT to_tsvector('english'::regconfig, o.text)) AS v(tsv)
        WHERE EXISTS (SELECT 1 FROM collections c WHERE c.id = o.collection_id)
    ), totals AS (
        INSERT INTO collection_text_stats AS st (collection_id, slot, chunk_count, token_count)
        SELECT collection_id, pg_backend_pid(), -count(*), -coalesce(sum(len), 0)
        FROM gone GROUP BY collection_id ORDER BY collection_id
        ON CONFLICT (collection_id, slot) DO UPDATE
        SET chunk_count = st.chunk_count + EXCLUDED.chunk_count,
            token_count = st.token_count + EXCLUDED.token_count
    ), touched AS MATERIALIZED (
        SELECT DISTINCT b.collection_id, b.lexeme, b.tier, b.first_seq
        FROM gone g CROSS JOIN LATERAL unnest(g.tsv) AS t
        CROSS JOIN LATERAL (
            SELECT p.collection_id, p.lexeme, p.tier, p.first_seq FROM chunk_postings p
            WHERE p.collection_id = g.collection_id AND p.lexeme = t.lexeme
              AND p.tier = ragservice_bm25_tier(coalesce(array_length(t.positions, 1), 1), g.len)
              AND p.first_seq <= g.seq AND p.last_seq >= g.seq AND g.seq = ANY(p.seqs)
            ORDER BY p.first_seq DESC LIMIT 1
        ) AS b
    ), rebuilt AS MATERIALIZED (
        SELECT k.collection_id, k.lexeme, k.tier, k.first_seq,
               count(u.seq) AS n, min(u.seq) AS lo, max(u.seq) AS hi,
               array_agg(u.seq ORDER BY u.seq) AS seqs,
               array_agg(u.tf ORDER BY u.seq) AS tfs,
               array_agg(u.len ORDER BY u.seq) AS lengths,
               max(u.tf) AS max_tf, min(u.len) AS min_len
        FROM touched k
        JOIN chunk_postings p USING (collection_id, lexeme, tier, first_seq)
        CROSS JOIN LATERAL unnest(p.seqs, p.tfs, p.lengths) AS u(seq, tf, len)
        WHERE NOT EXISTS (SELECT 1 FROM gone g WHERE g.seq = u.seq)
        GROUP BY k.collection_id, k.lexeme, k.tier, k.first_seq
    ), emptied AS (
        DELETE FROM chunk_postings p USING touched k
        WHERE (p.collection_id, p.lexeme, p.tier, p.first_seq)
              = (k.collection_id, k.lexeme, k.tier, k.first_seq)
          AND NOT EXISTS (
              SELECT 1 FROM rebuilt r
              WHERE (r.collection_id, r.lexeme, r.tier, r.first_seq)
                    = (k.collection_id, k.lexeme, k.tier, k.first_seq))
    )
    UPDATE chunk_postings p
    SET first_seq = r.lo, last_seq = r.hi, n = r.n, seqs = r.seqs, tfs = r.tfs,
        lengths = r.lengths, max_tf = r.max_tf, min_len = r.min_len
    FROM rebuilt r
    WHERE (p.collection_id, p.lexeme, p.tier, p.first_seq)
          = (r.collection_id, r.lexeme, r.tier, r.first_seq);
    RETURN NULL;
END $$
"""

# One lexeme range [lo, hi) of a collection: the short blocks of each key that has more than
# one are taken and regrouped by seq into blocks of 128 (at most one short block left per key).
_PACK_RANGE = """
    WITH keys AS (
        SELECT lexeme, tier FROM chunk_postings
        WHERE collection_id = target AND n < 128
          AND (range_lo IS NULL OR lexeme >= range_lo)
          AND (range_hi IS NULL OR lexeme < range_hi)
        GROUP BY lexeme, tier HAVING count(*) > 1
    ), taken AS (
        DELETE FROM chunk_postings p USING keys k
        WHERE p.collection_id = target AND p.lexeme = k.lexeme AND p.tier = k.tier
          AND p.n < 128
        RETURNING p.lexeme, p.tier, p.seqs, p.tfs, p.lengths
    ), keyed AS (
        SELECT t.lexeme, t.tier, count(*)::integer AS n,
               array_agg(u.seq ORDER BY u.seq) AS seqs, array_agg(u.tf ORDER BY u.seq) AS tfs,
               array_agg(u.len ORDER BY u.seq) AS lengths
        FROM taken t CROSS JOIN LATERAL unnest(t.seqs, t.tfs, t.lengths) AS u(seq, tf, len)
        GROUP BY t.lexeme, t.tier
    ), packed AS (
        INSERT INTO chunk_postings
            (collection_id, lexeme, tier, first_seq, last_seq, n, seqs, tfs, lengths,
             max_tf, min_len)
        SELECT target, k.lexeme, k.tier, k.seqs[b.lo], k.seqs[h.hi], h.hi - b.lo + 1,
               k.seqs[b.lo:h.hi], k.tfs[b.lo:h.hi], k.lengths[b.lo:h.hi], m.max_tf, m.min_len
        FROM keyed k CROSS JOIN LATERAL generate_series(1, k.n, 128) AS b(lo)
        CROSS JOIN LATERAL (SELECT least(b.lo + 127, k.n)) AS h(hi)
        CROSS JOIN LATERAL (
            SELECT max(u.tf) AS max_tf, min(u.len) AS min_len
            FROM unnest(k.tfs[b.lo:h.hi], k.lengths[b.lo:h.hi]) AS u(tf, len)
        ) AS m
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM taken), (SELECT count(*) FROM packed) INTO took, made;
"""

# Ranges of about 200,000 short blocks bound the memory of one pass. Totals rows a live
# transaction holds (a loader still writing) are left for a later pack.
_PACK = f"""
CREATE FUNCTION ragservice_pack_postings(target uuid, OUT blocks_before bigint,
                                         OUT blocks_after bigint)
LANGUAGE plpgsql SET work_mem = '256MB' AS $$
DECLARE
    bounds text[];
    range_lo text;
    range_hi text;
    took bigint;
    made bigint;
BEGIN
    PERFORM ragservice_lock_postings(ARRAY[target]);
    blocks_before := 0;
    blocks_after := 0;
    bounds := ARRAY(
        SELECT lexeme FROM (
            SELECT lexeme, row_number() OVER (ORDER BY lexeme) AS r FROM chunk_postings
            WHERE collection_id = target AND n < 128
        ) AS s WHERE r % 200000 = 0
    );
    FOR i IN 0 .. coalesce(array_length(bounds, 1), 0) LOOP
        range_lo := CASE WHEN i = 0 THEN NULL ELSE bounds[i] END;
        range_hi := bounds[i + 1];
{_PACK_RANGE}
        blocks_before := blocks_before + took;
        blocks_after := blocks_after + made;
    END LOOP;
    WITH folded AS (
        DELETE FROM collection_text_stats s
        WHERE s.ctid = ANY(ARRAY(
            SELECT ctid FROM collection_text_stats
            WHERE collection_id = target AND slot <> 0 FOR UPDATE SKIP LOCKED))
        RETURNING s.chunk_count, s.token_count
    )
    INSERT INTO collection_text_stats AS st (collection_id, slot, chunk_count, token_count)
    SELECT target, 0, sum(chunk_count), sum(token_count) FROM folded HAVING count(*) > 0
    ON CONFLICT (collection_id, slot) DO UPDATE
    SET chunk_count = st.chunk_count + EXCLUDED.chunk_count,
        token_count = st.token_count + EXCLUDED.token_count;
END $$
"""


def upgrade() -> None:
    op.add_column(
        "collection_text_stats",
        sa.Column("slot", sa.Integer, nullable=False, server_default="0"),
    )
    op.execute("ALTER TABLE collection_text_stats DROP CONSTRAINT collection_text_stats_pkey")
    op.execute(
        "ALTER TABLE collection_text_stats ADD CONSTRAINT collection_text_stats_pkey "
        "PRIMARY KEY (collection_id, slot)"
    )
    op.execute(_LOCK)
    op.execute(_INSERT)
    op.execute(_DELETE)
    op.execute(_PACK)


def downgrade() -> None:
    previous = _revision_0020()
    op.execute(previous._INSERT)
    op.execute(previous._DELETE)
    op.execute("DROP FUNCTION ragservice_pack_postings(uuid)")
    op.execute("DROP FUNCTION ragservice_lock_postings(uuid[])")
    # One row per collection again: the sum of its rows (all postings blocks stay valid; a
    # key's several short blocks are merged by its next write).
    op.execute(
        "UPDATE collection_text_stats s SET chunk_count = t.chunks, token_count = t.tokens "
        "FROM (SELECT collection_id, min(slot) AS slot, sum(chunk_count) AS chunks, "
        "sum(token_count) AS tokens FROM collection_text_stats GROUP BY collection_id) AS t "
        "WHERE s.collection_id = t.collection_id AND s.slot = t.slot"
    )
    op.execute(
        "DELETE FROM collection_text_stats s WHERE s.slot > "
        "(SELECT min(slot) FROM collection_text_stats t WHERE t.collection_id = s.collection_id)"
    )
    op.execute("ALTER TABLE collection_text_stats DROP CONSTRAINT collection_text_stats_pkey")
    op.drop_column("collection_text_stats", "slot")
    op.execute(
        "ALTER TABLE collection_text_stats ADD CONSTRAINT collection_text_stats_pkey "
        "PRIMARY KEY (collection_id)"
    )


def _revision_0020() -> ModuleType:
    """Migration 0020, whose trigger functions the downgrade restores."""
    path = Path(__file__).with_name("0020_posting_block_bounds.py")
    spec = importlib.util.spec_from_file_location("ragservice_migration_0020", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
