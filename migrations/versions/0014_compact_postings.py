"""BM25 postings in blocks ordered by impact, keyed by a compact chunk number.

- `chunks.seq`: a bigint per chunk (identity, unique), the key postings carry instead of the
  16-byte uuid.
- `chunk_postings`: one row per block of at most 128 postings of one (collection, lexeme, tier),
  the chunks' numbers, term frequencies and lengths in three parallel arrays. `tier` quantizes a
  posting's BM25 term-frequency part (`ragservice_bm25_tier`, fixed constants: deterministic
  from tf and length), so a search reads a term's postings from the highest impact down and may
  stop after a budget. It replaces `chunk_terms` (one row per posting: 9.6 KB per chunk).
- The statement-level triggers on `chunks` group one statement's postings into blocks. A key's
  last block may be short ("open", n < 128); the next write of that key merges into it, so
  one-document ingests do not leave one tiny block per lexeme. Deletes rewrite the blocks that
  held the deleted chunks (dropping emptied ones); `collection_text_stats` stays exact.
- `chunks.tsv` and its GIN index go: no query read them. The triggers compute
  `to_tsvector('english', text)` themselves.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY, UUID

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

POLICY = "(SELECT ragservice_all_tenants()) OR collection_id IN (SELECT id FROM collections)"

# BM25's term-frequency part with k1 = 0.9, b = 0.4 and a reference length of 100 lexemes,
# times 8: 0 (a long chunk that says the term once) to 15 (short chunks that repeat it).
_TIER = """
CREATE FUNCTION ragservice_bm25_tier(tf integer, len integer) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT least(15, floor(8 * tf * 1.9 / (tf + 0.9 * (0.6 + 0.4 * len / 100.0))))::smallint
$$
"""

# Writers of one collection lock its totals first, in collection order: they then take turns
# rewriting that collection's open blocks and never deadlock on them.
_LOCK_TOTALS = """
    INSERT INTO collection_text_stats AS st (collection_id, chunk_count, token_count)
    SELECT DISTINCT collection_id, 0, 0 FROM {source} ORDER BY 1
    ON CONFLICT (collection_id) DO UPDATE SET chunk_count = st.chunk_count;
"""

# `{source}`: the statement's new chunks (trigger) or every chunk (backfill). Fresh postings and
# those of the keys' open blocks are pooled, ordered by seq and cut into blocks of 128 (one
# sort: the aggregates share their order, and lexemes compare bytewise, COLLATE "C").
_ADD_POSTINGS = """
    WITH sized AS MATERIALIZED (
        SELECT s.seq, s.collection_id, v.tsv, ragservice_tsv_length(v.tsv) AS len
        FROM {source} s
        CROSS JOIN LATERAL (SELECT to_tsvector('english'::regconfig, s.text)) AS v(tsv)
    ), totals AS (
        UPDATE collection_text_stats st
        SET chunk_count = st.chunk_count + d.chunks, token_count = st.token_count + d.tokens
        FROM (SELECT collection_id, count(*) AS chunks, sum(len) AS tokens
              FROM sized GROUP BY collection_id) AS d
        WHERE st.collection_id = d.collection_id
    ), fresh AS MATERIALIZED (
        SELECT s.collection_id, t.lexeme, ragservice_bm25_tier(f.tf, s.len) AS tier,
               s.seq, f.tf, s.len
        FROM sized s CROSS JOIN LATERAL unnest(s.tsv) AS t
        CROSS JOIN LATERAL (SELECT coalesce(array_length(t.positions, 1), 1)) AS f(tf)
    ), opened AS (
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
    ), keyed AS (
        SELECT collection_id, lexeme, tier, count(*)::integer AS n,
               array_agg(seq ORDER BY seq) AS seqs, array_agg(tf::smallint ORDER BY seq) AS tfs,
               array_agg(len ORDER BY seq) AS lengths
        FROM pooled GROUP BY collection_id, lexeme, tier
    )
    INSERT INTO chunk_postings
        (collection_id, lexeme, tier, first_seq, last_seq, n, seqs, tfs, lengths)
    SELECT k.collection_id, k.lexeme, k.tier, k.seqs[b.lo], k.seqs[h.hi], h.hi - b.lo + 1,
           k.seqs[b.lo:h.hi], k.tfs[b.lo:h.hi], k.lengths[b.lo:h.hi]
    FROM keyed k CROSS JOIN LATERAL generate_series(1, k.n, 128) AS b(lo)
    CROSS JOIN LATERAL (SELECT least(b.lo + 127, k.n)) AS h(hi);
"""

# work_mem: a bulk statement of 20,000 chunks pools about a million postings; sorting them
# in memory rather than on disk halves the trigger's time.
_INSERT = f"""
CREATE FUNCTION ragservice_chunk_postings_insert() RETURNS trigger
LANGUAGE plpgsql SET work_mem = '64MB' AS $$
BEGIN
{_LOCK_TOTALS.format(source="new_chunks")}
{_ADD_POSTINGS.format(source="new_chunks")}
    RETURN NULL;
END $$
"""

# Chunks of a collection being deleted are skipped: their postings and totals go with the
# collection (foreign keys), with no blocks to rewrite.
_DELETE = """
CREATE FUNCTION ragservice_chunk_postings_delete() RETURNS trigger
LANGUAGE plpgsql SET work_mem = '64MB' AS $$
BEGIN
    PERFORM 1 FROM collection_text_stats
    WHERE collection_id IN (SELECT collection_id FROM old_chunks)
    ORDER BY collection_id FOR UPDATE;
    WITH gone AS MATERIALIZED (
        SELECT o.seq, o.collection_id, v.tsv, ragservice_tsv_length(v.tsv) AS len
        FROM old_chunks o
        CROSS JOIN LATERAL (SELECT to_tsvector('english'::regconfig, o.text)) AS v(tsv)
        WHERE EXISTS (SELECT 1 FROM collections c WHERE c.id = o.collection_id)
    ), totals AS (
        UPDATE collection_text_stats st
        SET chunk_count = st.chunk_count - d.chunks, token_count = st.token_count - d.tokens
        FROM (SELECT collection_id, count(*) AS chunks, sum(len) AS tokens
              FROM gone GROUP BY collection_id) AS d
        WHERE st.collection_id = d.collection_id
    ), touched AS MATERIALIZED (
        SELECT DISTINCT b.collection_id, b.lexeme, b.tier, b.first_seq
        FROM gone g CROSS JOIN LATERAL unnest(g.tsv) AS t
        CROSS JOIN LATERAL (
            SELECT p.collection_id, p.lexeme, p.tier, p.first_seq FROM chunk_postings p
            WHERE p.collection_id = g.collection_id AND p.lexeme = t.lexeme
              AND p.tier = ragservice_bm25_tier(coalesce(array_length(t.positions, 1), 1), g.len)
              AND p.first_seq <= g.seq AND p.last_seq >= g.seq
            ORDER BY p.first_seq DESC LIMIT 1
        ) AS b
    ), rebuilt AS MATERIALIZED (
        SELECT k.collection_id, k.lexeme, k.tier, k.first_seq,
               count(u.seq) AS n, min(u.seq) AS lo, max(u.seq) AS hi,
               array_agg(u.seq ORDER BY u.seq) AS seqs,
               array_agg(u.tf ORDER BY u.seq) AS tfs,
               array_agg(u.len ORDER BY u.seq) AS lengths
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
        lengths = r.lengths
    FROM rebuilt r
    WHERE (p.collection_id, p.lexeme, p.tier, p.first_seq)
          = (r.collection_id, r.lexeme, r.tier, r.first_seq);
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.add_column(
        "chunks", sa.Column("seq", sa.BigInteger, sa.Identity(always=False), nullable=False)
    )
    op.create_index("chunks_seq_key", "chunks", ["seq"], unique=True)
    _create_postings()
    op.execute(_TIER)
    op.execute("DROP TRIGGER chunks_terms_insert ON chunks")
    op.execute("DROP TRIGGER chunks_terms_delete ON chunks")
    op.execute("DROP FUNCTION ragservice_chunk_terms_insert()")
    op.execute("DROP FUNCTION ragservice_chunk_terms_delete()")
    op.drop_table("chunk_terms")
    op.execute(_INSERT)
    op.execute(_DELETE)
    op.execute(
        "CREATE TRIGGER chunks_postings_insert AFTER INSERT ON chunks "
        "REFERENCING NEW TABLE AS new_chunks "
        "FOR EACH STATEMENT EXECUTE FUNCTION ragservice_chunk_postings_insert()"
    )
    op.execute(
        "CREATE TRIGGER chunks_postings_delete AFTER DELETE ON chunks "
        "REFERENCING OLD TABLE AS old_chunks "
        "FOR EACH STATEMENT EXECUTE FUNCTION ragservice_chunk_postings_delete()"
    )
    # The totals are rebuilt with the postings, from the same lexemes.
    op.execute("DELETE FROM collection_text_stats")
    op.execute("SET LOCAL work_mem = '256MB'")
    op.execute(_LOCK_TOTALS.format(source="chunks"))
    op.execute(_ADD_POSTINGS.format(source="chunks"))
    op.drop_index("chunks_tsv_idx", table_name="chunks")
    op.drop_column("chunks", "tsv")


def _create_postings() -> None:
    op.create_table(
        "chunk_postings",
        sa.Column(
            "collection_id",
            UUID(as_uuid=True),
            sa.ForeignKey("collections.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("lexeme", sa.Text(collation="C"), nullable=False),
        sa.Column("tier", sa.SmallInteger, nullable=False),
        sa.Column("first_seq", sa.BigInteger, nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
        sa.Column("n", sa.Integer, nullable=False),
        sa.Column("seqs", ARRAY(sa.BigInteger), nullable=False),
        sa.Column("tfs", ARRAY(sa.SmallInteger), nullable=False),
        sa.Column("lengths", ARRAY(sa.Integer), nullable=False),
    )
    # INCLUDE: a term's document frequency and the blocks a search reads come from the index
    # alone; the arrays are fetched for the chosen blocks only.
    op.execute(
        "ALTER TABLE chunk_postings ADD CONSTRAINT chunk_postings_pkey "
        "PRIMARY KEY (collection_id, lexeme, tier, first_seq) INCLUDE (last_seq, n)"
    )
    # The open blocks writers merge into: at most one per key, a small index.
    op.execute(
        "CREATE INDEX chunk_postings_open_idx ON chunk_postings (collection_id, lexeme, tier) "
        "WHERE n < 128"
    )
    op.execute("ALTER TABLE chunk_postings ENABLE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant_isolation ON chunk_postings USING ({POLICY})")


# -- downgrade: 0002's postings, triggers and tsvector column --------------------------------

_OLD_INSERT = """
CREATE FUNCTION ragservice_chunk_terms_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH sized AS MATERIALIZED (
        SELECT id, collection_id, tsv, ragservice_tsv_length(tsv) AS len FROM new_chunks
    ), postings AS (
        INSERT INTO chunk_terms (collection_id, lexeme, chunk_id, tf, chunk_length)
        SELECT s.collection_id, t.lexeme, s.id, coalesce(array_length(t.positions, 1), 1), s.len
        FROM sized s CROSS JOIN LATERAL unnest(s.tsv) AS t
    )
    INSERT INTO collection_text_stats AS st (collection_id, chunk_count, token_count)
    SELECT collection_id, count(*), sum(len) FROM sized GROUP BY collection_id
    ON CONFLICT (collection_id) DO UPDATE
    SET chunk_count = st.chunk_count + EXCLUDED.chunk_count,
        token_count = st.token_count + EXCLUDED.token_count;
    RETURN NULL;
END $$
"""

_OLD_DELETE = """
CREATE FUNCTION ragservice_chunk_terms_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM chunk_terms t
    USING old_chunks o CROSS JOIN LATERAL unnest(tsvector_to_array(o.tsv)) AS x(lexeme)
    WHERE t.collection_id = o.collection_id AND t.lexeme = x.lexeme AND t.chunk_id = o.id;
    UPDATE collection_text_stats s
    SET chunk_count = s.chunk_count - d.chunks, token_count = s.token_count - d.tokens
    FROM (SELECT o.collection_id, count(*) AS chunks, sum(ragservice_tsv_length(o.tsv)) AS tokens
          FROM old_chunks o GROUP BY o.collection_id) AS d
    WHERE s.collection_id = d.collection_id;
    RETURN NULL;
END $$
"""

_OLD_BACKFILL = """
INSERT INTO chunk_terms (collection_id, lexeme, chunk_id, tf, chunk_length)
SELECT c.collection_id, t.lexeme, c.id, coalesce(array_length(t.positions, 1), 1),
       ragservice_tsv_length(c.tsv)
FROM chunks c CROSS JOIN LATERAL unnest(c.tsv) AS t
"""


def downgrade() -> None:
    op.add_column(
        "chunks",
        sa.Column(
            "tsv",
            sa.dialects.postgresql.TSVECTOR,
            sa.Computed("to_tsvector('english'::regconfig, text)", persisted=True),
        ),
    )
    op.create_index("chunks_tsv_idx", "chunks", ["tsv"], postgresql_using="gin")
    op.execute("DROP TRIGGER chunks_postings_insert ON chunks")
    op.execute("DROP TRIGGER chunks_postings_delete ON chunks")
    op.execute("DROP FUNCTION ragservice_chunk_postings_insert()")
    op.execute("DROP FUNCTION ragservice_chunk_postings_delete()")
    op.drop_table("chunk_postings")
    op.execute("DROP FUNCTION ragservice_bm25_tier(integer, integer)")
    op.create_table(
        "chunk_terms",
        sa.Column(
            "collection_id",
            UUID(as_uuid=True),
            sa.ForeignKey("collections.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("lexeme", sa.Text, nullable=False),
        sa.Column("chunk_id", UUID(as_uuid=True), nullable=False),
        sa.Column("tf", sa.SmallInteger, nullable=False),
        sa.Column("chunk_length", sa.Integer, nullable=False),
    )
    op.execute(
        "ALTER TABLE chunk_terms ADD CONSTRAINT chunk_terms_pkey "
        "PRIMARY KEY (collection_id, lexeme, chunk_id) INCLUDE (tf, chunk_length)"
    )
    op.execute("ALTER TABLE chunk_terms ENABLE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant_isolation ON chunk_terms USING ({POLICY})")
    op.execute(_OLD_INSERT)
    op.execute(_OLD_DELETE)
    op.execute(
        "CREATE TRIGGER chunks_terms_insert AFTER INSERT ON chunks "
        "REFERENCING NEW TABLE AS new_chunks "
        "FOR EACH STATEMENT EXECUTE FUNCTION ragservice_chunk_terms_insert()"
    )
    op.execute(
        "CREATE TRIGGER chunks_terms_delete AFTER DELETE ON chunks "
        "REFERENCING OLD TABLE AS old_chunks "
        "FOR EACH STATEMENT EXECUTE FUNCTION ragservice_chunk_terms_delete()"
    )
    op.execute(_OLD_BACKFILL)
    op.drop_index("chunks_seq_key", table_name="chunks")
    op.drop_column("chunks", "seq")
