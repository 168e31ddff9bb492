"""Each BM25 postings block carries what bounds its best score: `max_tf` and `min_len`.

A posting's BM25 term part, tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avgdl)), grows with
tf and shrinks with len for every k1 >= 0 and 0 <= b <= 1. So `idf * part(max_tf, min_len)` is
an upper bound of every posting in the block, whatever ranking the request asks for: a search
can skip the blocks that cannot bring a chunk into its top k and still return exactly BM25's
top k (block-max pruning). Both columns are in the primary key's INCLUDE list, so a search
reads the bounds of a term's blocks from the index alone. The statement triggers of 0014 keep
them on every write (recreated here with the two columns); existing blocks are backfilled.

Revision ID: 0020
Revises: 0019
Create Date: 2027-02-20
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

# As in 0014, with each new block's maximum tf and minimum length.
_INSERT = """
CREATE OR REPLACE FUNCTION ragservice_chunk_postings_insert() RETURNS trigger
LANGUAGE plpgsql SET work_mem = '64MB' AS $$
BEGIN
    INSERT INTO collection_text_stats AS st (collection_id, chunk_count, token_count)
    SELECT DISTINCT collection_id, 0, 0 FROM new_chunks ORDER BY 1
    ON CONFLICT (collection_id) DO UPDATE SET chunk_count = st.chunk_count;
    WITH sized AS MATERIALIZED (
        SELECT s.seq, s.collection_id, v.tsv, ragservice_tsv_length(v.tsv) AS len
        FROM new_chunks s
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
        (collection_id, lexeme, tier, first_seq, last_seq, n, seqs, tfs, lengths, max_tf, min_len)
    SELECT k.collection_id, k.lexeme, k.tier, k.seqs[b.lo], k.seqs[h.hi], h.hi - b.lo + 1,
           k.seqs[b.lo:h.hi], k.tfs[b.lo:h.hi], k.lengths[b.lo:h.hi], m.max_tf, m.min_len
    FROM keyed k CROSS JOIN LATERAL generate_series(1, k.n, 128) AS b(lo)
    CROSS JOIN LATERAL (SELECT least(b.lo + 127, k.n)) AS h(hi)
    CROSS JOIN LATERAL (
        SELECT max(u.tf) AS max_tf, min(u.len) AS min_len
        FROM unnest(k.tfs[b.lo:h.hi], k.lengths[b.lo:h.hi]) AS u(tf, len)
    ) AS m;
    RETURN NULL;
END $$
"""

_DELETE = """
CREATE OR REPLACE FUNCTION ragservice_chunk_postings_delete() RETURNS trigger
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

_BACKFILL = """
UPDATE chunk_postings p
SET max_tf = m.max_tf, min_len = m.min_len
FROM chunk_postings q
CROSS JOIN LATERAL (
    SELECT max(u.tf) AS max_tf, min(u.len) AS min_len FROM unnest(q.tfs, q.lengths) AS u(tf, len)
) AS m
WHERE (p.collection_id, p.lexeme, p.tier, p.first_seq)
      = (q.collection_id, q.lexeme, q.tier, q.first_seq)
"""

_PKEY = "ALTER TABLE chunk_postings ADD CONSTRAINT chunk_postings_pkey "


def upgrade() -> None:
    op.add_column("chunk_postings", sa.Column("max_tf", sa.SmallInteger, nullable=True))
    op.add_column("chunk_postings", sa.Column("min_len", sa.Integer, nullable=True))
    op.execute("SET LOCAL work_mem = '256MB'")
    op.execute(_BACKFILL)
    op.alter_column("chunk_postings", "max_tf", nullable=False)
    op.alter_column("chunk_postings", "min_len", nullable=False)
    op.execute(_INSERT)
    op.execute(_DELETE)
    op.execute("ALTER TABLE chunk_postings DROP CONSTRAINT chunk_postings_pkey")
    op.execute(
        _PKEY + "PRIMARY KEY (collection_id, lexeme, tier, first_seq) "
        "INCLUDE (last_seq, n, max_tf, min_len)"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE chunk_postings DROP CONSTRAINT chunk_postings_pkey")
    op.execute(_PKEY + "PRIMARY KEY (collection_id, lexeme, tier, first_seq) INCLUDE (last_seq, n)")
    op.execute(_INSERT.replace(", max_tf, min_len)", ")").replace(", m.max_tf, m.min_len", ""))
    op.execute(
        _DELETE.replace(",\n               max(u.tf) AS max_tf, min(u.len) AS min_len", "").replace(
            ", max_tf = r.max_tf, min_len = r.min_len", ""
        )
    )
    op.drop_column("chunk_postings", "min_len")
    op.drop_column("chunk_postings", "max_tf")
