-- complain if script is sourced in psql, rather than through ALTER EXTENSION
\echo Use "ALTER EXTENSION ragservice_bm25 UPDATE TO '1.1'" to load this file. \quit

-- One statement's BM25 postings as chunk_postings blocks: from each chunk's tsvector its length,
-- and per lexeme its tf and impact tier (ragservice_bm25_tier); grouped by (lexeme, tier),
-- ordered by seq, cut into blocks of 128 with their seq range, largest tf and smallest length.
-- The rows the postings triggers' SQL builds from the same chunks (migration 0025 uses it in
-- the append-mode trigger).
CREATE FUNCTION ragservice_bm25_blocks(seqs bigint[], tsvs tsvector[])
RETURNS TABLE (
    lexeme text, tier smallint, first_seq bigint, last_seq bigint, n integer,
    seqs bigint[], tfs smallint[], lengths integer[], max_tf smallint, min_len integer
)
AS 'MODULE_PATHNAME', 'ragservice_bm25_blocks'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE ROWS 10000;
