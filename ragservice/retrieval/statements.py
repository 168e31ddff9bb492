"""The SQL of a search, as composable pieces: dense candidates (HNSW), BM25 over the postings
(and pseudo-relevance feedback's expansion terms), the hits with their documents, and
neighbouring chunks.

Pieces refer to chunks as `c` and documents as `d`, as compiled filters do. Model id and
dimension are literals (the partial HNSW index matches a literal model id only); everything a
caller sends is a bound parameter.

The tenant: where a transaction works for one tenant, every tenant-owned table a statement reads
is restricted to it (`AND c.tenant_id = %(tenant)s::uuid`, `tenant_and`), and tenant-owned
tables are joined on tenant_id as well as on their keys. Row-level security shows the tenant's
rows only in any case; named in the statement, the tenant lets a store distributed by tenant_id
(Citus) run a search as one task on the worker that holds the tenant's shards (a router query),
and Citus joins distributed tables only on their distribution column. Across all tenants there
is no tenant predicate: the joins on tenant_id stay. The BM25 statistics and postings
(`collection_text_stats`, `chunk_postings`) are read by collection and tenant alike.
"""

from __future__ import annotations

import uuid

from psycopg import sql

from ragservice.retrieval.filters import CompiledFilter

TENANT = sql.SQL("AND {alias}.tenant_id = %(tenant)s::uuid")


def tenant_and(alias: str, tenant: uuid.UUID | None) -> sql.Composable:
    """The tenant predicate on the table `alias` names where the statement is run for one
    `tenant` (bound as %(tenant)s, not written into the SQL), else (None) nothing."""
    return sql.SQL("") if tenant is None else TENANT.format(alias=sql.SQL(alias))


# relaxed_order iterative scans keep reading the index until enough rows pass the filters
# (the collection restriction is a filter too). Their rows may come slightly out of order, so
# the candidates are materialized and sorted again outside, as the pgvector docs advise. SET
# LOCAL, which a Citus coordinator passes on to the workers that run the index scans.
SET_DENSE = sql.SQL(
    "SET LOCAL hnsw.ef_search = {ef_search}; SET LOCAL hnsw.iterative_scan = relaxed_order"
)

# The dense candidates: the vectors of the searched collections nearest the query. The
# vectors' rows carry their chunk's collection and readers (migration 0034), so a search
# without a metadata filter ranks them alone and joins only the few it keeps to their chunks
# (whose policy applies there too). For an asker who may not read every document, {visible}
# names the vectors it may read (`VISIBLE`).
NEAREST = sql.SQL("""
nearest AS MATERIALIZED (
    SELECT v.chunk_id, c.document_id, v.distance
    FROM (SELECT e.chunk_id, e.tenant_id, {distance} AS distance
          FROM chunk_embeddings e
          WHERE e.model_id = {model_id} AND e.collection_id = ANY(%(collections)s::uuid[])
                {tenant} {visible}
          ORDER BY {order}
          LIMIT {limit}) AS v
    JOIN chunks c ON c.id = v.chunk_id AND c.tenant_id = v.tenant_id {chunk_tenant}
)""")

# The exact ranking for an asker who may not read every document, where no metadata filter
# applies: the vectors it may read, ranked by `ragservice_nearest_visible` (migration 0034) with
# the indexes over `readers` (under row-level security the planner may not use them for the
# search's own, not leakproof `&&`), then joined to their chunks, whose policies apply here.
NEAREST_VISIBLE = sql.SQL("""
nearest AS MATERIALIZED (
    SELECT v.chunk_id, c.document_id, v.distance
    FROM ragservice_nearest_visible({model_id}, %(collections)s::uuid[], %(vector)s::vector,
                                    {limit}) AS v
    JOIN chunks c ON c.id = v.chunk_id AND c.tenant_id = v.tenant_id {chunk_tenant}
)""")

# The same under a metadata filter, which names chunks (`c`) and documents (`d`): each vector
# is joined to its chunk before the limit.
NEAREST_FILTERED = sql.SQL("""
nearest AS MATERIALIZED (
    SELECT e.chunk_id, c.document_id, {distance} AS distance
    FROM chunk_embeddings e
    JOIN chunks c ON c.id = e.chunk_id AND c.tenant_id = e.tenant_id {document_join}
    WHERE e.model_id = {model_id} AND e.collection_id = ANY(%(collections)s::uuid[]) {tenant}
          {visible} {filter}
    ORDER BY {order}
    LIMIT {limit}
)""")

# What an asker who may not read every document may read of the vectors: the condition of the
# `document_readers` policy with the asker's principals bound (%(readers)s). With the values
# written out the planner estimates its rows from the statistics of `readers` (the policy's own
# form it cannot); under row-level security it still uses no index for it (`&&` is not
# leakproof): that is `NEAREST_VISIBLE`'s.
VISIBLE = sql.SQL("AND (e.readers IS NULL OR e.readers && %(readers)s::text[])")

# The vectors a restricted asker may read, for the planner's estimate of how many they are
# (`dense.exact_is_cheaper`; the statement is only explained, never run).
VISIBLE_VECTORS = sql.SQL("""
SELECT 1 FROM chunk_embeddings e
WHERE e.model_id = {model_id} AND e.collection_id = ANY(%(collections)s::uuid[]) {tenant}
      {visible}""")

# The rows of a model's HNSW index as last counted (VACUUM, ANALYZE, CREATE INDEX).
INDEX_ROWS = sql.SQL("SELECT reltuples FROM pg_class WHERE oid = to_regclass(%(index)s)")


def hnsw_index_name(model_id: int) -> str:
    """The model's HNSW index (migrations 0007 and 0015 name it so)."""
    return f"chunk_embeddings_hnsw_model_{int(model_id)}"


# The cosine distance a model's HNSW index orders by: over `embedding` (float32), or over
# `embedding_half` for a model stored as halfvec (its index is over that column).
DISTANCE = sql.SQL("e.embedding::vector({dim}) <=> %(vector)s::vector({dim})")
DISTANCE_HALFVEC = sql.SQL(
    "e.embedding_half::halfvec({dim}) <=> %(vector)s::vector({dim})::halfvec({dim})"
)

# Ordered by the distance as the index orders (the planner chooses between the index and an
# exact ranking), or by an expression no index matches: an exact ranking of every row that
# passes the conditions, which a restricted or filtered search falls back to when the index's
# scan ended before it found the rows asked for (`hnsw.max_scan_tuples`).
EXACT_ORDER = sql.SQL("({distance}) + 0")

# A model stored as binary: {candidates} rows nearest by Hamming distance of the quantized
# vectors (the bit index), re-scored by the exact cosine distance of the full vectors. The
# expression matches the index's (migration 0015) so the planner uses it.
BINARY_DISTANCE = sql.SQL(
    "binary_quantize(e.embedding::vector({dim}))::bit({dim}) "
    "<~> binary_quantize(%(vector)s::vector({dim}))::bit({dim})"
)
NEAREST_BINARY = sql.SQL("""
coarse AS MATERIALIZED (
    SELECT e.chunk_id, c.document_id, e.embedding
    FROM chunk_embeddings e
    JOIN chunks c ON c.id = e.chunk_id AND c.tenant_id = e.tenant_id {document_join}
    WHERE e.model_id = {model_id} AND e.collection_id = ANY(%(collections)s::uuid[]) {tenant}
          {visible} {filter}
    ORDER BY {order}
    LIMIT {candidates}
),
nearest AS MATERIALIZED (
    SELECT chunk_id, document_id,
           embedding::vector({dim}) <=> %(vector)s::vector({dim}) AS distance
    FROM coarse
    ORDER BY distance, chunk_id
    LIMIT {limit}
)""")

# BM25, Lucene flavour, over the postings' blocks (`chunk_postings`, migration 0014). N and
# avgdl over the searched collections; df is the sum of the term's block sizes (from the index
# alone), so it is exact and follows the collection set. Each term's blocks are read from the
# highest impact tier down until %(budget)s postings: exact for a term in at most that many
# chunks, while a more frequent term (low idf) has its lowest-impact postings skipped. k1 and b
# are bound parameters. Chunks are named by `seq` until the end, where the few best are joined
# to `chunks` for their ids (ties at the cut all come along, so the order by id stays exact).
BM25_SCORES = sql.SQL("""
stats AS (
    SELECT sum(st.chunk_count)::float8 AS n,
           sum(st.token_count)::float8 / greatest(sum(st.chunk_count), 1) AS avgdl
    FROM collection_text_stats st
    WHERE st.collection_id = ANY(%(collections)s::uuid[]) {stats_tenant}
),
blocks AS MATERIALIZED (
    SELECT p.collection_id, p.lexeme, p.tier, p.first_seq, p.tenant_id,
           sum(p.n) OVER (PARTITION BY p.lexeme) AS df,
           sum(p.n) OVER (PARTITION BY p.lexeme ORDER BY p.tier DESC, p.collection_id, p.first_seq
                          ROWS UNBOUNDED PRECEDING) - p.n AS before
    FROM chunk_postings p
    WHERE p.collection_id = ANY(%(collections)s::uuid[]) {postings_tenant}
      AND p.lexeme = ANY({terms})
),
idf AS (
    SELECT DISTINCT b.lexeme, ln(1 + (s.n - b.df + 0.5) / (b.df + 0.5)) AS idf
    FROM blocks b CROSS JOIN stats s
),
postings AS (
    SELECT b.lexeme, u.seq, u.tf, u.len
    FROM blocks b
    JOIN chunk_postings p USING (collection_id, lexeme, tier, first_seq, tenant_id)
    CROSS JOIN LATERAL unnest(p.seqs, p.tfs, p.lengths) AS u(seq, tf, len)
    WHERE b.before < %(budget)s {postings_tenant}
),
bm25 AS MATERIALIZED (
    SELECT p.seq,
           sum({weight}i.idf * p.tf * (%(k1)s + 1)
               / (p.tf + %(k1)s * (1 - %(b)s + %(b)s * p.len / s.avgdl))) AS score
    FROM postings p JOIN idf i USING (lexeme) {weight_join} CROSS JOIN stats s
    GROUP BY p.seq
)""")
BM25_RANKED = sql.SQL("""
ranked AS (
    SELECT c.id AS chunk_id, c.document_id, b.score
    FROM bm25 b JOIN chunks c ON c.seq = b.seq {tenant} {filter_join}
    ORDER BY b.score DESC, c.id
    LIMIT {limit}
)""")

# Exact BM25 (the same scores as above, every posting counted) by the `ragservice_bm25`
# extension (extension/, migration 0023): its C function reads the terms' blocks from the highest
# score bound down and skips those that cannot bring a chunk into the top {limit} (block-max
# pruning). It returns the chunks at or above the limit-th best score; unfiltered searches only
# (a filter applies to chunks the function does not see).
BM25_EXACT = sql.SQL("""
bm25 AS MATERIALIZED (
    SELECT t.seq, t.score
    FROM {topk}%(collections)s::uuid[], {terms}, {weights}, {limit}, %(k1)s, %(b)s) AS t
),
ranked AS (
    SELECT c.id AS chunk_id, c.document_id, b.score
    FROM bm25 b JOIN chunks c ON c.seq = b.seq {tenant}
    ORDER BY b.score DESC, c.id
    LIMIT {limit}
)""")

# The same for an asker who may not read every document: the exact top %(depth)s (scores do
# not depend on who reads), deeper than the chunks wanted, whose visible ones `BM25_VISIBLE`
# then takes best first; the searcher deepens it when too few of them are visible.
BM25_EXACT_DEEP = sql.SQL("""
bm25 AS MATERIALIZED (
    SELECT t.seq, t.score
    FROM {topk}%(collections)s::uuid[], {terms}, {weights}, %(depth)s::int, %(k1)s,
                %(b)s) AS t
)""")

# The exact function over the public tables, or (a store distributed on Citus) over the shards
# of the asker's tenant: `ragservice db distribute` defines `ragservice_bm25_topk_tenant`, which
# runs inside the statement on the worker that holds the tenant (a query on a shard may not
# start a distributed one, so the function cannot read the distributed tables there).
TOPK = sql.SQL("ragservice_bm25_topk(")
TOPK_OF_TENANT = sql.SQL("ragservice_bm25_topk_tenant(%(tenant)s::uuid, ")

# Whether this database has the extension (an external server may not: the SQL above is used),
# whether it is a Citus coordinator, and whether it has the tenant's function (defined when the
# store is distributed): without it, full text on Citus is the SQL above, run on the tenant's
# shards, every posting read when it must be exact.
HAS_EXACT_BM25 = sql.Composed(
    [
        sql.SQL(
            "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'ragservice_bm25'), "
            "EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus'), "
            "to_regprocedure('public.ragservice_bm25_topk_tenant(uuid, uuid[], text[], "
            "float8[], integer, float8, float8)') IS NOT NULL"
        )
    ]
)

# The query's lexemes, each weighing 1 (BM25's OR over the query's words)...
QUERY_LEXEMES = sql.SQL("tsvector_to_array(to_tsvector('english'::regconfig, %(query)s))")
# ... or given lexemes with their weights (a query expanded by pseudo-relevance feedback).
WEIGHTED_LEXEMES = sql.SQL("%(terms)s::text[]")
WEIGHT_JOIN = sql.SQL(
    "JOIN unnest(%(terms)s::text[], %(weights)s::float8[]) AS w(lexeme, weight) USING (lexeme)"
)

# RM3's feedback model from the first pass's best chunks (`ranked`, limited to the feedback
# depth): P(t|R) = sum over those chunks of P(chunk) * tf / length, P(chunk) in proportion to its
# BM25 score; the %(fb_terms)s most likely lexemes, plus the query's own lexemes (p NULL) for the
# caller to interpolate. Only the feedback chunks' texts are parsed: the cost is bounded by the
# feedback depth, and the expanded query's postings by the per-term budget.
FEEDBACK = sql.SQL("""
feedback AS (
    SELECT r.chunk_id, r.score / nullif(sum(r.score) OVER (), 0) AS p_chunk FROM ranked r
),
chunk_terms AS (
    SELECT f.chunk_id, f.p_chunk, t.lexeme,
           coalesce(array_length(t.positions, 1), 1)::float8 AS tf
    FROM feedback f JOIN chunks c ON c.id = f.chunk_id {tenant}
    CROSS JOIN LATERAL unnest(to_tsvector('english'::regconfig, c.text)) AS t
)""")
FEEDBACK_TERMS = sql.SQL("""
(SELECT lexeme, sum(p_chunk * tf / length) AS p
 FROM (SELECT *, sum(tf) OVER (PARTITION BY chunk_id) AS length FROM chunk_terms) AS t
 GROUP BY lexeme ORDER BY p DESC, lexeme LIMIT %(fb_terms)s)
UNION ALL
SELECT DISTINCT lexeme, NULL::float8
FROM unnest(tsvector_to_array(to_tsvector('english'::regconfig, %(query)s))) AS lexeme""")

# For an asker who may not read every document (row-level security hides chunks, migration
# 0026), or under a metadata filter: the scored chunks are looked up best first, one by one,
# until {limit} visible ones that pass the filter; the nested loop keeps the score order, and
# stops as soon as it has them.
BM25_VISIBLE = sql.SQL("""
ranked AS (
    SELECT c.id AS chunk_id, c.document_id, b.score
    FROM (SELECT seq, score FROM bm25 ORDER BY score DESC, seq) AS b
    CROSS JOIN LATERAL (SELECT c.id, c.document_id FROM chunks c {document_join}
                        WHERE c.seq = b.seq {tenant} {filter}) AS c
    LIMIT {limit}
)""")

# Unfiltered, only the chunks scoring at least the limit-th best score are looked up.
BM25_CUT = sql.SQL(
    "WHERE b.score >= (SELECT min(t.score) FROM "
    "(SELECT score FROM bm25 ORDER BY score DESC LIMIT {limit}) AS t)"
)

DENSE_RANKED = sql.SQL("""
ranked AS (SELECT chunk_id, 1 - distance AS score FROM nearest)""")

# A side's candidates for fusion or document scoring, best first, with their documents.
DENSE_CANDIDATES = sql.SQL(
    "SELECT chunk_id, document_id, 1 - distance AS score FROM nearest ORDER BY distance, chunk_id"
)

# Hits ranked by the searcher (fused or grouped by document): their ids and scores, in order.
GIVEN = sql.SQL("""
ranked AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(scores)s::float8[]) AS r(chunk_id, score)
)""")

# A chunk the detector flagged (`metadata.injection`) in a collection whose policy is `drop`
# is never returned; `downweight` is applied by the searcher, which reorders the hits.
HITS = sql.SQL("""
SELECT r.chunk_id, r.score, c.text, c.ordinal, c.start_char, c.end_char, c.metadata,
       c.collection_id, col.name, d.id, d.external_id, d.title, d.metadata, d.version,
       col.flagged_chunks, c.page_start, c.page_end
FROM ranked r
JOIN chunks c ON c.id = r.chunk_id {tenant}
JOIN documents d ON d.id = c.document_id AND d.tenant_id = c.tenant_id
JOIN collections col ON col.id = c.collection_id AND col.tenant_id = c.tenant_id
WHERE NOT (col.flagged_chunks = 'drop' AND c.metadata ? 'injection')
ORDER BY r.score DESC, r.chunk_id""")

TEXT_CANDIDATES = sql.SQL(
    "SELECT chunk_id, document_id, score FROM ranked ORDER BY score DESC, chunk_id"
)

JOIN_DOCUMENTS = sql.SQL("JOIN documents d ON d.id = c.document_id AND d.tenant_id = c.tenant_id")

# Chunks within `distance` ordinals of the given ones, in the same documents (for continuity in
# an assembled context); the given chunks themselves are left out. Score 0: not retrieved.
NEIGHBOURS = sql.SQL("""
WITH ranked AS (
    SELECT DISTINCT n.id AS chunk_id, 0.0::float8 AS score
    FROM chunks h
    JOIN chunks n ON n.document_id = h.document_id AND n.tenant_id = h.tenant_id
                 AND n.ordinal BETWEEN h.ordinal - %(distance)s AND h.ordinal + %(distance)s
    WHERE h.id = ANY(%(ids)s::uuid[]) AND n.id <> ALL(%(ids)s::uuid[]) {tenant}
)
""")


def with_ctes(*ctes: sql.Composable, select: sql.Composable) -> sql.Composed:
    return sql.SQL("WITH {ctes}\n{select}").format(ctes=sql.SQL(",").join(ctes), select=select)


def hits(tenant: uuid.UUID | None) -> sql.Composed:
    """`HITS`, restricted to the `tenant` it is run for (None: across all tenants)."""
    return HITS.format(tenant=tenant_and("c", tenant))


def neighbours(tenant: uuid.UUID | None) -> sql.Composed:
    """`NEIGHBOURS`, restricted to the `tenant` it is run for (None: across all tenants)."""
    return NEIGHBOURS.format(tenant=tenant_and("h", tenant))


def feedback(tenant: uuid.UUID | None) -> sql.Composed:
    """`FEEDBACK`, restricted to the `tenant` it is run for (None: across all tenants)."""
    return FEEDBACK.format(tenant=tenant_and("c", tenant))


def filter_and(filters: CompiledFilter | None) -> sql.Composable:
    return sql.SQL("") if filters is None else sql.SQL("AND {}").format(filters.where)


def document_join(filters: CompiledFilter | None) -> sql.Composable:
    return JOIN_DOCUMENTS if filters is not None and filters.needs_document else sql.SQL("")


def bm25_filter_join(filters: CompiledFilter | None, limit: int) -> sql.Composable:
    """Filters apply before the LIMIT, so a filtered full-text search still returns k rows."""
    if filters is None:
        return BM25_CUT.format(limit=sql.Literal(limit))
    return sql.SQL("{docs} WHERE {where}").format(docs=document_join(filters), where=filters.where)


def _topk(of_tenant: bool, tenant: uuid.UUID | None) -> sql.Composable:
    """The exact function's call up to its collections."""
    return TOPK_OF_TENANT if of_tenant and tenant is not None else TOPK


def bm25(
    filters: CompiledFilter | None,
    limit: int,
    *,
    weighted: bool = False,
    exact: bool = False,
    restricted: bool = False,
    tenant: uuid.UUID | None = None,
    of_tenant: bool = False,
) -> sql.Composed:
    """BM25's CTEs down to `ranked` (the best `limit` chunks): over the query's lexemes, or
    `weighted` over %(terms)s with their %(weights)s (an expanded query). `exact` (the database
    has the extension) makes an unfiltered search exact with block-max pruning. `restricted`:
    the asker may not read every chunk, so the best `limit` are those it may read: the scored
    chunks (the exact function's top %(depth)s where `exact`, else the budgeted scores; never
    the score cut) are looked up best first until `limit` visible ones. `tenant`: the one the
    statement is run for (None: across all tenants); `of_tenant`: the exact function reads
    that tenant's shards (a store distributed on Citus)."""
    terms = WEIGHTED_LEXEMES if weighted else QUERY_LEXEMES
    scores = BM25_SCORES.format(
        stats_tenant=tenant_and("st", tenant),
        postings_tenant=tenant_and("p", tenant),
        terms=terms,
        weight=sql.SQL("w.weight * ") if weighted else sql.SQL(""),
        weight_join=WEIGHT_JOIN if weighted else sql.SQL(""),
    )
    if (restricted and filters is None) or (exact and filters is not None):
        if exact:
            scores = BM25_EXACT_DEEP.format(
                topk=_topk(of_tenant, tenant),
                terms=terms,
                weights=sql.SQL("%(weights)s::float8[]") if weighted else sql.SQL("NULL"),
            )
        visible = BM25_VISIBLE.format(
            limit=sql.Literal(limit),
            tenant=tenant_and("c", tenant),
            document_join=document_join(filters),
            filter=filter_and(filters),
        )
        return sql.SQL("{},{}").format(scores, visible)
    if exact and filters is None:
        return BM25_EXACT.format(
            topk=_topk(of_tenant, tenant),
            terms=terms,
            weights=sql.SQL("%(weights)s::float8[]") if weighted else sql.SQL("NULL"),
            limit=sql.Literal(limit),
            tenant=tenant_and("c", tenant),
        )
    ranked = BM25_RANKED.format(
        filter_join=bm25_filter_join(filters, limit),
        limit=sql.Literal(limit),
        tenant=tenant_and("c", tenant),
    )
    return sql.SQL("{},{}").format(scores, ranked)
