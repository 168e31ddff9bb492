"""Tenant isolation in the database: row-level security on every tenant-owned table, and the
`ragservice_service` role the service works as.

Each transaction of the service says whose rows it may see (`ragservice.db.tenancy`):
`ragservice.tenant_id` (one tenant: every HTTP request once authenticated, every ingest job) or
`ragservice.system = on` (the cross-tenant machinery: claiming jobs, purging the cache, operator
commands). A transaction that sets neither sees no row at all, so a query that forgets its
tenant filter returns nothing rather than another tenant's rows.

The policies bind `ragservice_service` (no superuser, no BYPASSRLS, not the tables' owner).
The owner (the migrating user) is not bound: migrations and the analytics views, which run
with their owner's rights, see every row, as before.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

ROLE = "ragservice_service"

# The settings are read through scalar subqueries in the policies, so PostgreSQL evaluates
# them once per statement (an InitPlan), not once per row.
_FUNCTIONS = """
CREATE FUNCTION ragservice_current_tenant() RETURNS uuid
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT nullif(current_setting('ragservice.tenant_id', true), '')::uuid
$$;
CREATE FUNCTION ragservice_all_tenants() RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(current_setting('ragservice.system', true), '') = 'on'
$$;
"""

_ALL = "(SELECT ragservice_all_tenants())"
_TENANT = "(SELECT ragservice_current_tenant())"

# table → the condition a row must meet to be seen or written.
POLICIES: dict[str, str] = {
    "tenants": f"id = {_TENANT} OR {_ALL}",
    **{
        table: f"tenant_id = {_TENANT} OR {_ALL}"
        for table in (
            "collections",
            "documents",
            "chunks",
            "chunk_embeddings",
            "ingest_jobs",
            "api_keys",
            "query_log",
            "feedback",
            "prompt_cache",
        )
    },
    # Rows owned through their parent: visible when the parent is (its own policy applies).
    "chunk_terms": f"{_ALL} OR collection_id IN (SELECT id FROM collections)",
    "collection_text_stats": f"{_ALL} OR collection_id IN (SELECT id FROM collections)",
    "ingest_job_items": f"{_ALL} OR job_id IN (SELECT id FROM ingest_jobs)",
    "prompt_cache_sources": f"{_ALL} OR entry_id IN (SELECT id FROM prompt_cache)",
}

# DDL the service asks for at run time (an HNSW index per embedding model) needs the tables'
# owner: these functions run with the owner's rights, and only build the fixed statements.
_DEFINER_FUNCTIONS = (
    "ragservice_ensure_embedding_index(integer, integer, integer, integer)",
    "ragservice_ensure_cache_index(integer, integer)",
    "ragservice_drop_embedding_index(integer)",
)

_DROP_INDEX = """
CREATE FUNCTION ragservice_drop_embedding_index(p_model_id integer) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('DROP INDEX IF EXISTS %I', format('chunk_embeddings_hnsw_model_%s', p_model_id));
END $$
"""

# Like the analysts' role: cluster-wide, so it may exist already; a migrating user that may not
# create roles gets a warning, and the service then says at start that RLS is not enforced.
_ROLE = f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{ROLE}') THEN
        IF NOT EXISTS (SELECT 1 FROM pg_roles
                       WHERE rolname = current_user AND (rolsuper OR rolcreaterole)) THEN
            RAISE WARNING 'role {ROLE} not created: % may not create roles', current_user;
            RETURN;
        END IF;
        CREATE ROLE {ROLE} NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
    END IF;
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        -- the migrating user connects for the service and switches to the role (SET ROLE)
        EXECUTE format('GRANT {ROLE} TO %I', current_user);
    END IF;
    GRANT USAGE ON SCHEMA public TO {ROLE};
    GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {ROLE};
    GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {ROLE};
    -- tables of later migrations, created by the same user
    ALTER DEFAULT PRIVILEGES IN SCHEMA public
        GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {ROLE};
    ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO {ROLE};
    -- the analytics views are for analysts; the service never reads them
    REVOKE ALL ON SCHEMA analytics FROM {ROLE};
END $$
"""


def upgrade() -> None:
    op.execute(_FUNCTIONS)
    op.execute(_DROP_INDEX)
    for signature in _DEFINER_FUNCTIONS:
        op.execute(f"ALTER FUNCTION {signature} SECURITY DEFINER SET search_path = public")
        op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
    for table, condition in POLICIES.items():
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY tenant_isolation ON {table} USING ({condition})")
    op.execute(_ROLE)
    op.execute(
        f"""
        DO $$
        BEGIN
            IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{ROLE}') THEN
                {" ".join(f"GRANT EXECUTE ON FUNCTION {s} TO {ROLE};" for s in _DEFINER_FUNCTIONS)}
            END IF;
        END $$
        """
    )


def downgrade() -> None:
    # The role stays (cluster-wide: other databases on the server may use it).
    for table in POLICIES:
        op.execute(f"DROP POLICY IF EXISTS tenant_isolation ON {table}")
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
    for signature in _DEFINER_FUNCTIONS[:2]:
        op.execute(f"ALTER FUNCTION {signature} SECURITY INVOKER RESET search_path")
        op.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO PUBLIC")
    op.execute("DROP FUNCTION ragservice_drop_embedding_index(integer)")
    op.execute("DROP FUNCTION ragservice_all_tenants()")
    op.execute("DROP FUNCTION ragservice_current_tenant()")
