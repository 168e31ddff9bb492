"""Analysts see their tenant only, through barrier views, and create no temporary objects.

- `analyst_tenants`: which tenant each analyst login may read (NULL: every tenant). Owned by the
  migrating user; neither analysts nor the service role may read or write it.
- Every view in schema `analytics` keeps its columns and shows only rows of a tenant the
  current user is bound to, so an analyst without a row sees nothing. The views run with their
  owner's rights (the migrating user, the tables' owner, whom row-level security does not bind:
  migration 0007 enables it without FORCE), so the lookup needs no privilege of the analyst.
- The views become `security_barrier`: a function or a failing cast in an analyst's WHERE
  clause runs after the view's own conditions, never on rows the view would not return.
- `TEMPORARY` on this database is revoked from PUBLIC and `ragservice_analyst`, and granted to
  `ragservice_service` (bulk writes stage COPY in a temporary table). A database's ACL is not
  part of its schema: a database created from a template or restored from a plain dump starts
  with PostgreSQL's default again; `ragservice analysts add|update` re-apply it.

Existing analysts (members of `ragservice_analyst`) are bound to every tenant, so what they
see does not change, and get a statement timeout of 60 s (and the same idle-in-transaction
timeout) unless they have one. Downgrading restores the 0006 views, drops the bindings and gives
`TEMPORARY` back to PUBLIC (PostgreSQL's default); role settings stay (roles are server-wide).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

ANALYST = "ragservice_analyst"
SERVICE = "ragservice_service"
# What existing analysts get; new ones get RAGSERVICE_ANALYST_STATEMENT_TIMEOUT_SECONDS.
EXISTING_ANALYST_TIMEOUT = "60s"
# Kept equal to migration 0006's, so the views show the same rows as before for an analyst
# bound to every tenant.
WEAK_SCORE_THRESHOLD = 0.3


def _scope(tenant_id: str) -> str:
    """The condition each view adds: the current user is bound to the row's tenant or all."""
    return (
        "EXISTS (SELECT 1 FROM analyst_tenants a WHERE a.role_name = current_user "
        f"AND (a.tenant_id IS NULL OR a.tenant_id = {tenant_id}))"
    )


# name → definition: migration 0006's views, each with the tenant condition before any
# aggregation (the columns are unchanged, so CREATE OR REPLACE VIEW keeps comments and grants).
VIEWS: dict[str, str] = {
    "queries_per_day": f"""
        SELECT date_trunc('day', q.created_at)::date AS day,
               q.tenant_id, t.name AS tenant,
               c.id AS collection_id, c.name AS collection,
               q.endpoint,
               count(*) AS queries
        FROM query_log q
        JOIN tenants t ON t.id = q.tenant_id
        LEFT JOIN LATERAL unnest(q.collection_ids) AS qc(collection_id) ON true
        LEFT JOIN collections c ON c.id = qc.collection_id
        WHERE {_scope("q.tenant_id")}
        GROUP BY 1, 2, 3, 4, 5, 6
        """,
    "cache_hit_rate": f"""
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
        WHERE jsonb_typeof(q.cache) = 'object' AND {_scope("q.tenant_id")}
        GROUP BY 1, 2, 3
        """,
    "stage_latency": f"""
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
          AND {_scope("q.tenant_id")}
        GROUP BY 1, 2, 3, 4
        """,
    "negative_feedback": f"""
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
        WHERE ((f.scale = 'thumbs' AND f.rating = -1) OR (f.scale = 'stars' AND f.rating <= 2))
          AND {_scope("f.tenant_id")}
        """,
    "weak_retrieval": f"""
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
          AND {_scope("q.tenant_id")}
        """,
    "ingest_jobs": f"""
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
        WHERE {_scope("j.tenant_id")}
        """,
    "corpus": f"""
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
        WHERE {_scope("c.tenant_id")}
        """,
    "feedback_summary": f"""
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
        WHERE {_scope("f.tenant_id")}
        GROUP BY 1, 2, 3
        """,
}

# The database's ACL. The owner (or a superuser) may change it; anyone else gets a warning, and
# docs/analysts.md has the statements for an administrator. The service role is granted
# TEMPORARY first, so its bulk writes never lose it.
_RESTRICT_TEMPORARY = f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_database d WHERE d.datname = current_database()
                   AND pg_has_role(current_user, d.datdba, 'USAGE')) THEN
        RAISE WARNING 'TEMPORARY on database % not revoked from PUBLIC: % does not own it',
            current_database(), current_user;
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{SERVICE}') THEN
        EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO {SERVICE}', current_database());
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{ANALYST}') THEN
        EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM {ANALYST}', current_database());
    END IF;
    EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
END $$
"""

_RESTORE_TEMPORARY = f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_database d WHERE d.datname = current_database()
                   AND pg_has_role(current_user, d.datdba, 'USAGE')) THEN
        RETURN;
    END IF;
    EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO PUBLIC', current_database());
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{SERVICE}') THEN
        EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM {SERVICE}', current_database());
    END IF;
END $$
"""

# Existing analysts keep seeing every tenant, and get a timeout unless they have one. ALTER
# ROLE needs the role's ADMIN option (its creator has it) or a superuser: else a warning.
_EXISTING_ANALYSTS = f"""
DO $$
DECLARE
    analyst name;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{ANALYST}') THEN
        RETURN;
    END IF;
    -- Not the members with ADMIN OPTION: the creator of the group role (PostgreSQL 16 makes
    -- one that is not a superuser such a member) is no analyst.
    FOR analyst IN
        SELECT r.rolname FROM pg_roles r
        JOIN pg_auth_members m ON m.member = r.oid
        JOIN pg_roles g ON g.oid = m.roleid
        WHERE g.rolname = '{ANALYST}' AND NOT m.admin_option
    LOOP
        INSERT INTO analyst_tenants (role_name, tenant_id) VALUES (analyst, NULL)
        ON CONFLICT (role_name) DO NOTHING;
        RAISE NOTICE 'analyst % may read every tenant (see docs/analysts.md)', analyst;
        IF NOT EXISTS (SELECT 1 FROM pg_roles r, unnest(r.rolconfig) AS c
                       WHERE r.rolname = analyst AND c LIKE 'statement_timeout=%') THEN
            BEGIN
                EXECUTE format('ALTER ROLE %I SET statement_timeout = %L', analyst,
                               '{EXISTING_ANALYST_TIMEOUT}');
                EXECUTE format('ALTER ROLE %I SET idle_in_transaction_session_timeout = %L',
                               analyst, '{EXISTING_ANALYST_TIMEOUT}');
            EXCEPTION WHEN insufficient_privilege THEN
                RAISE WARNING 'no statement timeout set for analyst %: % may not alter it',
                    analyst, current_user;
            END;
        END IF;
    END LOOP;
END $$
"""


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE analyst_tenants (
            role_name text PRIMARY KEY,
            tenant_id uuid REFERENCES tenants (id) ON DELETE CASCADE,
            created_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        "COMMENT ON TABLE analyst_tenants IS 'The tenant each analyst login may read in the "
        "analytics views (NULL: every tenant); no row: none (docs/analysts.md).'"
    )
    # Migration 0007's default privileges give the service role every new table; it needs
    # none of this one (a service that could write it could widen an analyst's view).
    op.execute("REVOKE ALL ON analyst_tenants FROM PUBLIC")
    op.execute(
        f"""
        DO $$
        BEGIN
            IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{SERVICE}') THEN
                REVOKE ALL ON analyst_tenants FROM {SERVICE};
            END IF;
            IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{ANALYST}') THEN
                REVOKE ALL ON analyst_tenants FROM {ANALYST};
            END IF;
        END $$
        """
    )
    for name, definition in VIEWS.items():
        op.execute(
            f"CREATE OR REPLACE VIEW analytics.{name} WITH (security_barrier = true) "
            f"AS {definition}"
        )
    op.execute(_EXISTING_ANALYSTS)
    op.execute(_RESTRICT_TEMPORARY)


def downgrade() -> None:
    op.execute(_RESTORE_TEMPORARY)
    for name, (definition, _comment) in _views_of_0006().items():
        op.execute(f"CREATE OR REPLACE VIEW analytics.{name} AS {definition}")
        op.execute(f"ALTER VIEW analytics.{name} RESET (security_barrier)")
    op.execute("DROP TABLE analyst_tenants")


def _views_of_0006() -> dict[str, tuple[str, str]]:
    """Migration 0006's view definitions (its module name starts with a digit: loaded by path)."""
    path = Path(__file__).with_name("0006_analytics.py")
    spec = importlib.util.spec_from_file_location("ragservice_migration_0006", path)
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    views: dict[str, tuple[str, str]] = module.VIEWS
    return views
