-- complain if script is sourced in psql, rather than through ALTER EXTENSION
\echo Use "ALTER EXTENSION ragservice_bm25 UPDATE TO '1.0'" to load this file. \quit

DROP FUNCTION ragservice_bm25_blocks(bigint[], tsvector[]);
