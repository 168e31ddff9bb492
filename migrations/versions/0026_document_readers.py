"""Who may read which document: readers on documents and chunks, groups, and the asker's
principal set enforced by row-level security.

- `documents.readers` (text[]): the principals that may read the document, `user:<name>` and
  `group:<name>`; NULL: the whole tenant (every document before this revision). `chunks.readers`
  is the same list, copied from the chunk's document when it is written or changed.
- `group_members`: which users belong to which groups, per tenant.
- `api_keys.user_name`: the user a key acts for (NULL: a key of no user).
- `ingest_job_items.readers`: the readers a queued document is to get.
- `query_log.asker` and `feedback.asker`: who asked (`user:<name>`, or the key).
- `ingest_jobs.asker` (who queued it) and `ingest_jobs.restricted` (it named readers, or wrote a
  document that has some): such a job's counts and per-file errors are shown to its asker and to
  those who read every document only.
- `prompt_cache.source_documents`: the documents a cached answer was built from (the same ids
  as its `prompt_cache_sources` rows, sorted, where the policy below can read them). A question
  of one scope may now have an entry per set of sources (askers who read different documents
  get different answers): the unique key is (scope, prompt_hash, source_documents).

Each transaction states, besides its tenant, the principal set of its asker
(`ragservice.readers`, set like the tenant by `ragservice.db.tenancy`): `*` (every document of
the tenant: operators, ingest jobs, admin keys of no user) or an array literal
(`{user:ana,group:hr}`). The restrictive policies below show a document or a chunk only when it
has no readers, the set is `*` (or the transaction works as the system role), or the lists
overlap. A transaction that sets no principal set sees the unrestricted documents only (fail
closed). A cached answer, a logged question and its feedback are seen only when every document
they were built from is.

Revision ID: 0026
Revises: 0025
Create Date: 2027-04-20
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

SYSTEM_ROLE = "ragservice_system"

_FUNCTIONS = f"""
CREATE FUNCTION ragservice_reads_all() RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(current_setting('ragservice.readers', true), '') = '*'
        OR current_user = '{SYSTEM_ROLE}'
$$;
CREATE FUNCTION ragservice_current_readers() RETURNS text[]
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN coalesce(current_setting('ragservice.readers', true), '') IN ('', '*')
                THEN '{{}}'::text[]
                ELSE current_setting('ragservice.readers', true)::text[] END
$$;
"""

# Read through scalar subqueries: evaluated once per statement (an InitPlan), not per row.
_ALL = "(SELECT ragservice_reads_all())"
_MINE = "(SELECT ragservice_current_readers())"
_READABLE = f"readers IS NULL OR {_ALL} OR readers && {_MINE}"


def _sources_readable(column: str) -> str:
    """Every document id in `column` names a document the transaction sees (documents' own
    policies apply inside): a deleted or hidden source hides the row."""
    return (
        f"{_ALL} OR NOT EXISTS (SELECT 1 FROM unnest({column}) AS s(id) "
        "WHERE NOT EXISTS (SELECT 1 FROM documents d WHERE d.id = s.id))"
    )


# table → the condition a row must also meet (AND with the tenant's policy of 0007). Writes
# are not restricted by these (WITH CHECK true): the tenant policy still binds them.
POLICIES: dict[str, str] = {
    "documents": _READABLE,
    "chunks": _READABLE,
    "prompt_cache": _sources_readable("source_documents"),
    # the documents shown to the model, and every document retrieved (their ids are kept)
    "query_log": f"{_sources_readable('source_document_ids')} AND ({_ALL} OR NOT EXISTS ("
    "SELECT 1 FROM jsonb_array_elements(CASE WHEN jsonb_typeof(retrieved) = 'array' "
    "THEN retrieved ELSE '[]'::jsonb END) AS r(hit) WHERE NOT EXISTS "
    "(SELECT 1 FROM documents d WHERE d.id = (r.hit ->> 'document_id')::uuid)))",
    "feedback": f"{_ALL} OR EXISTS (SELECT 1 FROM query_log q WHERE q.id = feedback.query_id)",
    "ingest_jobs": f"NOT restricted OR {_ALL} OR ARRAY[asker] && {_MINE}",
}

_TENANT_POLICY = (
    "tenant_id = (SELECT ragservice_current_tenant()) OR (SELECT ragservice_all_tenants())"
)

# The upkeep that documents' triggers do (cache invalidation, the query log's redaction) must
# reach every row built on the changed documents, also those the changing transaction may not
# read: each function reads every document of the transaction's tenant while it runs (the
# tenant's own policy still applies), then puts the asker's set back.
_ELEVATE = (
    "$$\nDECLARE\n    saved text := coalesce(current_setting('ragservice.readers', true), '');\n"
    "BEGIN\n    PERFORM set_config('ragservice.readers', '*', true);\n"
)
_RESTORE = "    PERFORM set_config('ragservice.readers', saved, true);\n    RETURN NULL;"

# A document's readers changed (whatever path: the API's PATCH, an ingest, plain SQL): its
# chunks follow, and the cached answers built on it go.
_READERS_CHANGED = f"""
CREATE FUNCTION ragservice_documents_readers_changed() RETURNS trigger
LANGUAGE plpgsql AS {_ELEVATE}
    WITH changed AS (
        SELECT n.id, n.readers FROM new_documents n JOIN old_documents o USING (id)
        WHERE n.readers IS DISTINCT FROM o.readers
    ), chunks_changed AS (
        UPDATE chunks c SET readers = changed.readers FROM changed
        WHERE c.document_id = changed.id AND c.readers IS DISTINCT FROM changed.readers
    )
    DELETE FROM prompt_cache p USING prompt_cache_sources s, changed
    WHERE s.entry_id = p.id AND s.document_id = changed.id;
{_RESTORE}
END $$
"""


def _upkeep_functions() -> dict[str, str]:
    """The trigger functions of 0004 and 0012, by name: their definitions there."""
    cache = _migration("0004_prompt_cache.py")
    retention = _migration("0012_retention.py")
    return {
        "ragservice_cache_invalidate_updated": cache._INVALIDATE_UPDATED,
        "ragservice_cache_invalidate_inserted": cache._INVALIDATE_INSERTED,
        "ragservice_cache_invalidate_deleted": cache._INVALIDATE_DELETED,
        "ragservice_query_log_redact_deleted": retention._REDACT_DELETED,
    }


def _elevated(definition: str) -> str:
    body = definition.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    assert body.count("$$\nBEGIN\n") == 1 and body.count("    RETURN NULL;") == 1, body
    return body.replace("$$\nBEGIN\n", _ELEVATE).replace("    RETURN NULL;", _RESTORE)


ANALYST = "ragservice_analyst"
# view → the line its select list ends before (in migration 0017's definitions)
_VIEWS = {
    "negative_feedback": "\n        FROM feedback f\n",
    "weak_retrieval": "\n        FROM query_log q\n",
}
_ANALYST_COLUMNS = (
    ",\n               q.asker,"
    "\n               ARRAY(SELECT DISTINCT r FROM documents sd CROSS JOIN LATERAL "
    "unnest(sd.readers) AS r WHERE sd.id = ANY(q.source_document_ids) ORDER BY r) "
    "AS source_readers"
)


def upgrade() -> None:
    op.add_column("documents", sa.Column("readers", postgresql.ARRAY(sa.Text()), nullable=True))
    op.add_column("chunks", sa.Column("readers", postgresql.ARRAY(sa.Text()), nullable=True))
    op.add_column(
        "ingest_job_items", sa.Column("readers", postgresql.ARRAY(sa.Text()), nullable=True)
    )
    op.add_column("api_keys", sa.Column("user_name", sa.Text(), nullable=True))
    op.add_column("query_log", sa.Column("asker", sa.Text(), nullable=True))
    op.add_column("feedback", sa.Column("asker", sa.Text(), nullable=True))
    op.add_column("ingest_jobs", sa.Column("asker", sa.Text(), nullable=True))
    op.add_column(
        "ingest_jobs",
        sa.Column("restricted", sa.Boolean(), nullable=False, server_default="false"),
    )
    op.add_column(
        "prompt_cache",
        sa.Column(
            "source_documents",
            postgresql.ARRAY(postgresql.UUID()),
            nullable=False,
            server_default="{}",
        ),
    )
    op.execute(
        "UPDATE prompt_cache p SET source_documents = s.ids FROM "
        "(SELECT entry_id, array_agg(document_id ORDER BY document_id) AS ids "
        "FROM prompt_cache_sources GROUP BY entry_id) AS s WHERE s.entry_id = p.id"
    )
    op.add_column(
        "prompt_cache",
        sa.Column("built_for", postgresql.ARRAY(sa.Text()), nullable=False, server_default="{*}"),
    )
    op.drop_constraint("prompt_cache_scope_prompt_hash_key", "prompt_cache", type_="unique")
    op.create_unique_constraint(
        "prompt_cache_scope_prompt_sources_key",
        "prompt_cache",
        ["scope", "prompt_hash", "source_documents", "built_for"],
    )
    op.create_table(
        "group_members",
        sa.Column(
            "tenant_id",
            postgresql.UUID(),
            sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("group_name", sa.Text(), primary_key=True),
        sa.Column("user_name", sa.Text(), primary_key=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    )
    op.create_index("group_members_user", "group_members", ["tenant_id", "user_name"])
    op.execute("ALTER TABLE group_members ENABLE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant_isolation ON group_members USING ({_TENANT_POLICY})")
    op.execute(_FUNCTIONS)
    for table, condition in POLICIES.items():
        op.execute(
            f"CREATE POLICY document_readers ON {table} AS RESTRICTIVE "
            f"USING ({condition}) WITH CHECK (true)"
        )
    for name, definition in _views_with_readers().items():
        op.execute(
            f"CREATE OR REPLACE VIEW analytics.{name} WITH (security_barrier = true) "
            f"AS {definition}"
        )
    for definition in _upkeep_functions().values():
        op.execute(_elevated(definition))
    op.execute(_READERS_CHANGED)
    op.execute(
        "CREATE TRIGGER documents_readers_changed AFTER UPDATE ON documents "
        "REFERENCING OLD TABLE AS old_documents NEW TABLE AS new_documents "
        "FOR EACH STATEMENT EXECUTE FUNCTION ragservice_documents_readers_changed()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER documents_readers_changed ON documents")
    op.execute("DROP FUNCTION ragservice_documents_readers_changed()")
    for definition in _upkeep_functions().values():
        op.execute(definition.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    views_0017 = _migration("0017_query_log_trace.py")._views_with_request_ids()
    views_0006 = _migration("0006_analytics.py").VIEWS
    for name in _VIEWS:
        op.execute(f"DROP VIEW analytics.{name}")
        op.execute(
            f"CREATE VIEW analytics.{name} WITH (security_barrier = true) AS {views_0017[name]}"
        )
        comment = views_0006[name][1].replace("'", "''")
        op.execute(f"COMMENT ON VIEW analytics.{name} IS '{comment}'")
        op.execute(
            f"""
            DO $$
            BEGIN
                IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{ANALYST}') THEN
                    GRANT SELECT ON analytics.{name} TO {ANALYST};
                END IF;
            END $$
            """
        )
    for table in POLICIES:
        op.execute(f"DROP POLICY document_readers ON {table}")
    op.execute("DROP FUNCTION ragservice_current_readers()")
    op.execute("DROP FUNCTION ragservice_reads_all()")
    op.drop_table("group_members")
    # One entry per question and scope again: the newest of each stays.
    op.execute(
        "DELETE FROM prompt_cache p USING prompt_cache q WHERE p.scope = q.scope "
        "AND p.prompt_hash = q.prompt_hash AND (p.created_at, p.id) < (q.created_at, q.id)"
    )
    op.drop_constraint("prompt_cache_scope_prompt_sources_key", "prompt_cache", type_="unique")
    op.create_unique_constraint(
        "prompt_cache_scope_prompt_hash_key", "prompt_cache", ["scope", "prompt_hash"]
    )
    op.drop_column("prompt_cache", "built_for")
    op.drop_column("prompt_cache", "source_documents")
    op.drop_column("ingest_jobs", "restricted")
    op.drop_column("ingest_jobs", "asker")
    op.drop_column("feedback", "asker")
    op.drop_column("query_log", "asker")
    op.drop_column("api_keys", "user_name")
    op.drop_column("ingest_job_items", "readers")
    op.drop_column("chunks", "readers")
    op.drop_column("documents", "readers")


def _views_with_readers() -> dict[str, str]:
    views: dict[str, str] = _migration("0017_query_log_trace.py")._views_with_request_ids()
    changed = {}
    for name, end_of_select in _VIEWS.items():
        definition = views[name]
        assert definition.count(end_of_select) == 1, name
        changed[name] = definition.replace(end_of_select, f"{_ANALYST_COLUMNS}{end_of_select}")
    return changed


def _migration(filename: str) -> Any:
    """An earlier migration's module (its name starts with a digit: loaded by path)."""
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"ragservice_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
