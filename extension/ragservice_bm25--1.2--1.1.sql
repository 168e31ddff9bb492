-- complain if script is sourced in psql, rather than through ALTER EXTENSION
\echo Use "ALTER EXTENSION ragservice_bm25 UPDATE TO '1.1'" to load this file. \quit

DROP FUNCTION ragservice_bm25_topk_in(regclass, regclass, uuid[], text[], float8[], integer,
                                      float8, float8);
