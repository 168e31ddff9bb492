"""The query log knows its request: `query_log.request_id` and `query_log.trace_id`.

`request_id` is the HTTP request's `X-Request-ID` (the one its log lines carry), `trace_id` its
OpenTelemetry trace while tracing is on; both are null for rows written before this revision.
The analysts' per-question views `negative_feedback` and `weak_retrieval` show both, last.

Revision ID: 0017
Revises: 0016
Create Date: 2027-01-27
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

ANALYST = "ragservice_analyst"

# view → the line its select list ends before (in migration 0008's definitions)
_VIEWS = {
    "negative_feedback": "\n        FROM feedback f\n",
    "weak_retrieval": "\n        FROM query_log q\n",
}


def upgrade() -> None:
    # Nullable without a default: PostgreSQL adds the columns without rewriting the table.
    op.add_column("query_log", sa.Column("request_id", sa.Text(), nullable=True))
    op.add_column("query_log", sa.Column("trace_id", sa.Text(), nullable=True))
    # Columns appended last: CREATE OR REPLACE VIEW keeps the views' grants and comments.
    for name, definition in _views_with_request_ids().items():
        op.execute(
            f"CREATE OR REPLACE VIEW analytics.{name} WITH (security_barrier = true) "
            f"AS {definition}"
        )


def downgrade() -> None:
    # A view cannot lose columns in place: dropped and made again as 0008 left it.
    views_0008 = _migration("0008_analysts_scoped.py").VIEWS
    views_0006 = _migration("0006_analytics.py").VIEWS
    for name in _VIEWS:
        op.execute(f"DROP VIEW analytics.{name}")
        op.execute(
            f"CREATE VIEW analytics.{name} WITH (security_barrier = true) AS {views_0008[name]}"
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
    op.drop_column("query_log", "trace_id")
    op.drop_column("query_log", "request_id")


def _views_with_request_ids() -> dict[str, str]:
    views: dict[str, str] = _migration("0008_analysts_scoped.py").VIEWS
    changed = {}
    for name, end_of_select in _VIEWS.items():
        definition = views[name]
        assert definition.count(end_of_select) == 1, name
        changed[name] = definition.replace(
            end_of_select, f",\n               q.request_id, q.trace_id{end_of_select}"
        )
    return changed


def _migration(filename: str) -> Any:
    """An earlier migration's module (its name starts with a digit: loaded by path)."""
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"ragservice_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
