-- complain if script is sourced in psql, rather than through CREATE EXTENSION
\echo Use "CREATE EXTENSION ragservice_bm25" to load this file. \quit

-- The chunks (by seq) whose BM25 score over `terms` (weighted by `weights`, NULL: 1 each) in
-- the given collections is at least the k-th best, with their scores: exactly the top k of an
-- exhaustive BM25 (Lucene's idf; N and the average length from collection_text_stats; df from
-- the blocks), ties at the cut included. Reads public.chunk_postings and
-- public.collection_text_stats as the caller: row-level security applies.
CREATE FUNCTION ragservice_bm25_topk(
    collections uuid[], terms text[], weights float8[], k integer, k1 float8, b float8
) RETURNS TABLE (seq bigint, score float8)
AS 'MODULE_PATHNAME', 'ragservice_bm25_topk'
LANGUAGE C STABLE PARALLEL RESTRICTED ROWS 100;

-- What the last call in this session read: blocks in the collections' term lists, blocks
-- read, postings read, rounds (for benchmarks and tests of the pruning).
CREATE FUNCTION ragservice_bm25_last_stats(
    OUT blocks bigint, OUT blocks_read bigint, OUT postings_read bigint, OUT rounds integer
) AS 'MODULE_PATHNAME', 'ragservice_bm25_last_stats'
LANGUAGE C VOLATILE PARALLEL RESTRICTED;
