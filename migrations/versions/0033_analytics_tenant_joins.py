"""The analytics views join a tenant's rows on the tenant too.

`analytics.queries_per_day` joined a logged question's collections by id alone, and
`analytics.negative_feedback` a verdict's question by id alone; `corpus` counted a collection's
documents, chunks and vectors, and `negative_feedback` and `weak_retrieval` gathered the source
documents' readers, in subqueries matching ids alone. The rows matched always belong to the
same tenant, so adding `tenant_id` equality to each changes no row; it lets Citus run the views
on a distributed store (it joins distributed tables only on their distribution column). Each
view keeps its columns, so CREATE OR REPLACE VIEW keeps comments and grants. On a store already
distributed the queries are in the functions the views read there, and are changed there.

Revision ID: 0033
Revises: 0032
Create Date: 2027-06-22
"""

from __future__ import annotations

from alembic import op

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None

_DOCUMENT_READERS = (
    "WHERE (sd.id = ANY (q.source_document_ids))",
    "WHERE ((sd.id = ANY (q.source_document_ids)) AND (sd.tenant_id = q.tenant_id))",
)

# view → (a join or correlated condition as PostgreSQL prints it, the same on the tenant too)
JOINS: dict[str, list[tuple[str, str]]] = {
    "queries_per_day": [
        (
            "(c.id = qc.collection_id)",
            "((c.id = qc.collection_id) AND (c.tenant_id = q.tenant_id))",
        )
    ],
    "negative_feedback": [
        (
            "(q.id = f.query_id)",
            "((q.id = f.query_id) AND (q.tenant_id = f.tenant_id))",
        ),
        _DOCUMENT_READERS,
    ],
    "weak_retrieval": [_DOCUMENT_READERS],
    "corpus": [
        (
            "WHERE (d.collection_id = c.id)",
            "WHERE ((d.collection_id = c.id) AND (d.tenant_id = c.tenant_id))",
        ),
        (
            "WHERE (ch.collection_id = c.id)",
            "WHERE ((ch.collection_id = c.id) AND (ch.tenant_id = c.tenant_id))",
        ),
        (
            "ON ((ch.id = e.chunk_id))",
            "ON (((ch.id = e.chunk_id) AND (ch.tenant_id = e.tenant_id)))",
        ),
        (
            "WHERE ((ch.collection_id = c.id) AND (e.model_id = m.id))",
            "WHERE ((ch.collection_id = c.id) AND (ch.tenant_id = c.tenant_id) "
            "AND (e.model_id = m.id))",
        ),
    ],
}


def _replace(view: str, replacements: list[tuple[str, str]]) -> None:
    """Apply `replacements` to the view's query: in the view, or, on a store distributed on
    Citus, in the function the view reads (`ragservice db distribute`, `citus_schema`)."""
    conn = op.get_bind()
    function = f"analytics.{view}_rows()"
    wrapped = conn.exec_driver_sql(f"SELECT to_regprocedure('{function}')").scalar()
    if wrapped is not None:
        definition = conn.exec_driver_sql(
            f"SELECT pg_get_functiondef('{function}'::regprocedure)"
        ).scalar_one()
    else:
        definition = conn.exec_driver_sql(
            f"SELECT pg_get_viewdef('analytics.{view}'::regclass)"
        ).scalar_one()
    for old, new in replacements:
        if definition.count(old) != 1:
            raise RuntimeError(f"analytics.{view}: expected {old!r} once in {definition}")
        definition = definition.replace(old, new)
    if wrapped is not None:
        conn.exec_driver_sql(definition)
    else:
        conn.exec_driver_sql(
            f"CREATE OR REPLACE VIEW analytics.{view} WITH (security_barrier = true) AS "
            + definition.rstrip().rstrip(";")
        )


def upgrade() -> None:
    for view, replacements in JOINS.items():
        _replace(view, replacements)


def downgrade() -> None:
    for view, replacements in JOINS.items():
        _replace(view, [(new, old) for old, new in reversed(replacements)])
