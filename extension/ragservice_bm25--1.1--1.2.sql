-- complain if script is sourced in psql, rather than through ALTER EXTENSION
\echo Use "ALTER EXTENSION ragservice_bm25 UPDATE TO '1.2'" to load this file. \quit

-- ragservice_bm25_topk over given tables: public.chunk_postings and
-- public.collection_text_stats or a Citus shard of each (any other table is refused). On a Citus
-- worker the function reads the shards that hold a tenant: a query on a shard may not start a
-- distributed one (ragservice db distribute defines ragservice_bm25_topk_tenant over it).
CREATE FUNCTION ragservice_bm25_topk_in(
    postings regclass, totals regclass,
    collections uuid[], terms text[], weights float8[], k integer, k1 float8, b float8
) RETURNS TABLE (seq bigint, score float8)
AS 'MODULE_PATHNAME', 'ragservice_bm25_topk_in'
LANGUAGE C STABLE PARALLEL RESTRICTED ROWS 100;
