"""The SQL of a search, as composable pieces: dense candidates (HNSW), BM25 over the postings,
reciprocal rank fusion, the hits with their documents, and neighbouring chunks.

Pieces refer to chunks as `c` and documents as `d`, as compiled filters do. Model id and
dimension are literals (the partial HNSW index matches a literal model id only); everything a
caller sends is a bound parameter.
"""

from __future__ import annotations

from psycopg import sql

from ragservice.retrieval.filters import CompiledFilter

# relaxed_order iterative scans keep reading the index until enough rows pass the filters
# (the collection restriction is a filter too). Their rows may come slightly out of order, so
# the candidates are materialized and sorted again outside, as the pgvector docs advise.
SET_DENSE = sql.SQL(
    "SELECT set_config('hnsw.ef_search', %(ef_search)s, true), "
    "set_config('hnsw.iterative_scan', 'relaxed_order', true)"
)

NEAREST = sql.SQL("""
nearest AS MATERIALIZED (
    SELECT e.chunk_id, e.embedding::vector({dim}) <=> %(vector)s::vector({dim}) AS distance
    FROM chunk_embeddings e
    JOIN chunks c ON c.id = e.chunk_id {document_join}
    WHERE e.model_id = {model_id} AND c.collection_id = ANY(%(collections)s::uuid[]) {filter}
    ORDER BY distance
    LIMIT {limit}
)""")

# A model stored as halfvec: the same over `embedding_half` (its index is over that column).
NEAREST_HALFVEC = sql.SQL("""
nearest AS MATERIALIZED (
    SELECT e.chunk_id,
           e.embedding_half::halfvec({dim}) <=> %(vector)s::vector({dim})::halfvec({dim})
               AS distance
    FROM chunk_embeddings e
    JOIN chunks c ON c.id = e.chunk_id {document_join}
    WHERE e.model_id = {model_id} AND c.collection_id = ANY(%(collections)s::uuid[]) {filter}
    ORDER BY distance
    LIMIT {limit}
)""")

# A model stored as binary: {candidates} rows nearest by Hamming distance of the quantized
# vectors (the bit index), re-scored by the exact cosine distance of the full vectors. The
# expression matches the index's (migration 0015) so the planner uses it.
NEAREST_BINARY = sql.SQL("""
coarse AS MATERIALIZED (
    SELECT e.chunk_id, e.embedding
    FROM chunk_embeddings e
    JOIN chunks c ON c.id = e.chunk_id {document_join}
    WHERE e.model_id = {model_id} AND c.collection_id = ANY(%(collections)s::uuid[]) {filter}
    ORDER BY binary_quantize(e.embedding::vector({dim}))::bit({dim})
             <~> binary_quantize(%(vector)s::vector({dim}))::bit({dim})
    LIMIT {candidates}
),
nearest AS MATERIALIZED (
    SELECT chunk_id, embedding::vector({dim}) <=> %(vector)s::vector({dim}) AS distance
    FROM coarse
    ORDER BY distance, chunk_id
    LIMIT {limit}
)""")

# BM25, Lucene flavour. N and avgdl over the searched collections; df counted from the same
# posting scan, so both follow the collection set. k1 and b are bound parameters.
BM25 = sql.SQL("""
stats AS (
    SELECT sum(chunk_count)::float8 AS n,
           sum(token_count)::float8 / greatest(sum(chunk_count), 1) AS avgdl
    FROM collection_text_stats WHERE collection_id = ANY(%(collections)s::uuid[])
),
postings AS MATERIALIZED (
    SELECT t.lexeme, t.chunk_id, t.tf, t.chunk_length
    FROM chunk_terms t
    WHERE t.collection_id = ANY(%(collections)s::uuid[])
      AND t.lexeme = ANY(tsvector_to_array(to_tsvector('english'::regconfig, %(query)s)))
),
idf AS (
    SELECT p.lexeme, ln(1 + (s.n - count(*) + 0.5) / (count(*) + 0.5)) AS idf
    FROM postings p CROSS JOIN stats s
    GROUP BY p.lexeme, s.n
),
bm25 AS (
    SELECT p.chunk_id,
           sum(i.idf * p.tf * (%(k1)s + 1)
               / (p.tf + %(k1)s * (1 - %(b)s + %(b)s * p.chunk_length / s.avgdl))) AS score
    FROM postings p JOIN idf i USING (lexeme) CROSS JOIN stats s
    GROUP BY p.chunk_id
),
ranked AS (
    SELECT b.chunk_id, b.score
    FROM bm25 b {filter_join}
    ORDER BY b.score DESC, b.chunk_id
    LIMIT {limit}
)""")

DENSE_RANKED = sql.SQL("""
ranked AS (SELECT chunk_id, 1 - distance AS score FROM nearest)""")

FUSED = sql.SQL("""
dense AS (
    SELECT chunk_id, row_number() OVER (ORDER BY distance, chunk_id) AS rank FROM nearest
),
fulltext AS (
    SELECT * FROM unnest(%(text_ids)s::uuid[], %(text_ranks)s::int[]) AS t(chunk_id, rank)
),
ranked AS (
    SELECT chunk_id, sum(1.0::float8 / (%(rrf_k)s + rank)) AS score
    FROM (SELECT chunk_id, rank FROM dense UNION ALL SELECT chunk_id, rank FROM fulltext) AS u
    GROUP BY chunk_id
    ORDER BY score DESC, chunk_id
    LIMIT {limit}
)""")

# A chunk the detector flagged (`metadata.injection`) in a collection whose policy is `drop`
# is never returned; `downweight` is applied by the searcher, which reorders the hits.
HITS = sql.SQL("""
SELECT r.chunk_id, r.score, c.text, c.ordinal, c.start_char, c.end_char, c.metadata,
       c.collection_id, col.name, d.id, d.external_id, d.title, d.metadata, d.version,
       col.flagged_chunks
FROM ranked r
JOIN chunks c ON c.id = r.chunk_id
JOIN documents d ON d.id = c.document_id
JOIN collections col ON col.id = c.collection_id
WHERE NOT (col.flagged_chunks = 'drop' AND c.metadata ? 'injection')
ORDER BY r.score DESC, r.chunk_id""")

TEXT_CANDIDATES = sql.SQL("SELECT chunk_id FROM ranked ORDER BY score DESC, chunk_id")

JOIN_DOCUMENTS = sql.SQL("JOIN documents d ON d.id = c.document_id")

# Chunks within `distance` ordinals of the given ones, in the same documents (for continuity in
# an assembled context); the given chunks themselves are left out. Score 0: not retrieved.
NEIGHBOURS = sql.SQL("""
WITH ranked AS (
    SELECT DISTINCT n.id AS chunk_id, 0.0::float8 AS score
    FROM chunks h
    JOIN chunks n ON n.document_id = h.document_id
                 AND n.ordinal BETWEEN h.ordinal - %(distance)s AND h.ordinal + %(distance)s
    WHERE h.id = ANY(%(ids)s::uuid[]) AND n.id <> ALL(%(ids)s::uuid[])
)
""")


def with_ctes(*ctes: sql.Composable, select: sql.Composable) -> sql.Composed:
    return sql.SQL("WITH {ctes}\n{select}").format(ctes=sql.SQL(",").join(ctes), select=select)


def filter_and(filters: CompiledFilter | None) -> sql.Composable:
    return sql.SQL("") if filters is None else sql.SQL("AND {}").format(filters.where)


def document_join(filters: CompiledFilter | None) -> sql.Composable:
    return JOIN_DOCUMENTS if filters is not None and filters.needs_document else sql.SQL("")


def bm25_filter_join(filters: CompiledFilter | None) -> sql.Composable:
    """Filters apply before the LIMIT, so a filtered full-text search still returns k rows."""
    if filters is None:
        return sql.SQL("")
    return sql.SQL("JOIN chunks c ON c.id = b.chunk_id {docs} WHERE {where}").format(
        docs=document_join(filters), where=filters.where
    )
