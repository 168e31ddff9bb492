"""Read-only SQL access for analysts: documented views in schema `analytics` and the
`ragservice_analyst` role that may read them and nothing else.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# The top retrieved score below which a dense query (cosine similarity, no reranking) counts
# as weak retrieval. Other modes score on scales of their own (BM25, reciprocal rank fusion,
# cross-encoder logits), so for them only "nothing retrieved" and "no citations" count.
WEAK_SCORE_THRESHOLD = 0.3

ROLE = "ragservice_analyst"

# name → (definition, comment). Views run with their owner's rights (the default, not
# security_invoker), so the analyst role reads through them without any table privilege.
# None of them selects api_keys, prompts sent upstream (query_log.messages) or cached responses.
VIEWS: dict[str, tuple[str, str]] = {
    "queries_per_day": (
        """
        SELECT date_trunc('day', q.created_at)::date AS day,
               q.tenant_id, t.name AS tenant,
               c.id AS collection_id, c.name AS collection,
               q.endpoint,
               count(*) AS queries
        FROM query_log q
        JOIN tenants t ON t.id = q.tenant_id
        LEFT JOIN LATERAL unnest(q.collection_ids) AS qc(collection_id) ON true
        LEFT JOIN collections c ON c.id = qc.collection_id
        GROUP BY 1, 2, 3, 4, 5, 6
        """,
        "Questions asked per day, tenant, collection and endpoint (query, search...). "
        "A question over several collections counts once in each; collection is NULL when "
        "the question named none.",
    ),
    "cache_hit_rate": (
        """
        SELECT date_trunc('day', q.created_at)::date AS day,
               q.tenant_id, t.name AS tenant,
               count(*) AS lookups,
               count(*) FILTER (WHERE (q.cache ->> 'hit')::boolean) AS hits,
               count(*) FILTER (WHERE (q.cache ->> 'hit')::boolean
                                  AND q.cache ->> 'kind' = 'exact') AS exact,
               count(*) FILTER (WHERE (q.cache ->> 'hit')::boolean
                                  AND q.cache ->> 'kind' = 'semantic') AS semantic,
               round(count(*) FILTER (WHERE (q.cache ->> 'hit')::boolean)::numeric
                     / count(*), 4) AS hit_rate
        FROM query_log q
        JOIN tenants t ON t.id = q.tenant_id
        WHERE jsonb_typeof(q.cache) = 'object'
        GROUP BY 1, 2, 3
        """,
        "Prompt cache lookups per day and tenant: lookups (questions that consulted the "
        "cache), hits, exact and semantic hits, hit_rate = hits / lookups (0..1).",
    ),
    "stage_latency": (
        """
        SELECT date_trunc('day', q.created_at)::date AS day,
               q.tenant_id, t.name AS tenant,
               s.key AS stage,
               count(*) AS samples,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY s.value::text::double precision)
                   AS p50_ms,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY s.value::text::double precision)
                   AS p95_ms,
               percentile_cont(0.99) WITHIN GROUP (ORDER BY s.value::text::double precision)
                   AS p99_ms
        FROM query_log q
        JOIN tenants t ON t.id = q.tenant_id
        CROSS JOIN LATERAL jsonb_each(q.timings) AS s(key, value)
        WHERE jsonb_typeof(q.timings) = 'object' AND jsonb_typeof(s.value) = 'number'
        GROUP BY 1, 2, 3, 4
        """,
        "Per day, tenant and stage (embed, search, rerank, context, generate, cache_lookup, "
        "total): the number of questions timed and the 50th, 95th and 99th percentile in "
        "milliseconds (percentile_cont).",
    ),
    "negative_feedback": (
        """
        SELECT f.id AS feedback_id, f.created_at,
               f.tenant_id, t.name AS tenant,
               f.query_id, q.created_at AS asked_at, q.endpoint,
               f.scale, f.rating, f.comment, f.corrected_answer,
               q.question, q.answer, q.status,
               ARRAY(SELECT DISTINCT (e ->> 'document_id')::uuid
                     FROM jsonb_array_elements(q.citations) AS e
                     WHERE e ->> 'document_id' IS NOT NULL) AS cited_document_ids,
               ARRAY(SELECT DISTINCT (e ->> 'document_id')::uuid
                     FROM jsonb_array_elements(q.retrieved) AS e
                     WHERE e ->> 'document_id' IS NOT NULL) AS retrieved_document_ids
        FROM feedback f
        JOIN query_log q ON q.id = f.query_id
        JOIN tenants t ON t.id = f.tenant_id
        WHERE (f.scale = 'thumbs' AND f.rating = -1) OR (f.scale = 'stars' AND f.rating <= 2)
        """,
        "Each bad rating (thumbs -1, or 1-2 stars) with the question, the answer, the comment, "
        "the corrected answer, and the ids of the documents the answer cited and retrieval "
        "returned (join analytics.corpus or ask for titles by id).",
    ),
    "weak_retrieval": (
        f"""
        SELECT q.id AS query_id, q.created_at,
               q.tenant_id, t.name AS tenant,
               q.endpoint, q.question, q.status,
               q.params ->> 'mode' AS mode,
               jsonb_array_length(q.retrieved) AS retrieved,
               jsonb_array_length(q.citations) AS citations,
               (q.retrieved -> 0 ->> 'score')::double precision AS top_score,
               CASE
                   WHEN jsonb_array_length(q.retrieved) = 0 THEN 'nothing_retrieved'
                   WHEN q.params ->> 'mode' = 'dense'
                        AND coalesce((q.params ->> 'rerank')::boolean, false) = false
                        AND (q.retrieved -> 0 ->> 'score')::double precision
                            < {WEAK_SCORE_THRESHOLD}
                       THEN 'low_score'
                   ELSE 'no_citations'
               END AS reason
        FROM query_log q
        JOIN tenants t ON t.id = q.tenant_id
        WHERE q.status IN ('ok', 'extractive')
          AND coalesce((q.cache ->> 'hit')::boolean, false) = false
          AND (jsonb_array_length(q.retrieved) = 0
               OR jsonb_array_length(q.citations) = 0
               OR (q.params ->> 'mode' = 'dense'
                   AND coalesce((q.params ->> 'rerank')::boolean, false) = false
                   AND (q.retrieved -> 0 ->> 'score')::double precision
                       < {WEAK_SCORE_THRESHOLD}))
        """,
        "Answered questions (cache hits left out) whose retrieval looks weak: nothing "
        "retrieved, an answer without citations, or in dense mode without reranking a top "
        f"cosine similarity below {WEAK_SCORE_THRESHOLD}. reason says which came first.",
    ),
    "ingest_jobs": (
        """
        SELECT j.id AS job_id, j.tenant_id, t.name AS tenant,
               j.collection_id, c.name AS collection,
               j.kind, j.status, j.counts,
               jsonb_array_length(j.errors) AS error_count,
               j.attempts, j.created_at, j.started_at, j.finished_at,
               extract(epoch FROM j.finished_at - j.started_at) AS duration_s,
               extract(epoch FROM coalesce(j.started_at, now()) - j.created_at) AS queued_s
        FROM ingest_jobs j
        JOIN tenants t ON t.id = j.tenant_id
        LEFT JOIN collections c ON c.id = j.collection_id
        """,
        "Ingest job history: kind, status, counts (as the job reported them), number of "
        "errors, attempts, timestamps, run time in seconds (finished - started) and time "
        "queued in seconds.",
    ),
    "corpus": (
        """
        SELECT c.tenant_id, t.name AS tenant,
               c.id AS collection_id, c.name AS collection,
               m.id AS model_id, m.name AS model, m.version AS model_version,
               m.active AS model_active,
               (SELECT count(*) FROM documents d WHERE d.collection_id = c.id) AS documents,
               (SELECT count(*) FROM chunks ch WHERE ch.collection_id = c.id) AS chunks,
               (SELECT count(*) FROM chunk_embeddings e JOIN chunks ch ON ch.id = e.chunk_id
                WHERE ch.collection_id = c.id AND e.model_id = m.id) AS embedded_chunks
        FROM collections c
        JOIN tenants t ON t.id = c.tenant_id
        CROSS JOIN embedding_models m
        """,
        "Per collection and embedding model: documents and chunks in the collection, and how "
        "many of its chunks have an embedding from that model (embedded_chunks < chunks: "
        "re-embedding is incomplete).",
    ),
    "feedback_summary": (
        """
        SELECT date_trunc('day', f.created_at)::date AS day,
               f.tenant_id, t.name AS tenant,
               count(*) AS feedback,
               count(*) FILTER (WHERE f.scale = 'thumbs' AND f.rating = 1) AS thumbs_up,
               count(*) FILTER (WHERE f.scale = 'thumbs' AND f.rating = -1) AS thumbs_down,
               round(avg(f.rating) FILTER (WHERE f.scale = 'stars'), 2) AS stars_avg,
               count(*) FILTER (WHERE f.corrected_answer IS NOT NULL) AS corrections,
               sum(cardinality(f.relevant_chunk_ids) + cardinality(f.irrelevant_chunk_ids))
                   AS chunks_judged
        FROM feedback f
        JOIN tenants t ON t.id = f.tenant_id
        GROUP BY 1, 2, 3
        """,
        "Feedback per day and tenant: rows, thumbs up and down, average stars, corrected "
        "answers, and chunks judged relevant or irrelevant.",
    ),
}


def upgrade() -> None:
    op.execute("CREATE SCHEMA analytics")
    op.execute("COMMENT ON SCHEMA analytics IS 'Read-only views for analysts (docs/analysts.md).'")
    for name, (definition, comment) in VIEWS.items():
        op.execute(f"CREATE VIEW analytics.{name} AS {definition}")
        op.execute(f"COMMENT ON VIEW analytics.{name} IS '{comment.replace(chr(39), chr(39) * 2)}'")
    # Roles are cluster-wide: another database on the server may have created it already. A
    # migrating user that may not create roles (some managed servers) gets a warning instead of
    # a failed start; `ragservice analysts add` then says the role is missing.
    op.execute(
        f"""
        DO $$
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{ROLE}') THEN
                IF NOT EXISTS (SELECT 1 FROM pg_roles
                               WHERE rolname = current_user AND (rolsuper OR rolcreaterole)) THEN
                    RAISE WARNING 'role {ROLE} not created: % may not create roles', current_user;
                    RETURN;
                END IF;
                CREATE ROLE {ROLE} NOLOGIN;
            END IF;
            REVOKE ALL ON SCHEMA public FROM {ROLE};
            REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {ROLE};
            GRANT USAGE ON SCHEMA analytics TO {ROLE};
            GRANT SELECT ON ALL TABLES IN SCHEMA analytics TO {ROLE};
        END $$
        """
    )


def downgrade() -> None:
    # The role stays: roles belong to the whole server, and other databases on it (other
    # deployments, test databases) may still grant it their own analytics schema.
    op.execute("DROP SCHEMA IF EXISTS analytics CASCADE")
