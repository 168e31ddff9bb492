"""`ragservice db distribute` on a server without Citus, and the distribution plan against the
migrated schema (the cluster itself is in tests/citus)."""

from __future__ import annotations

from typing import Any

import psycopg
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from ragservice.cli import app
from ragservice.db import distribution
from ragservice.db.distribution import BlockerKind


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _schema_state(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """Every constraint and policy of the public schema: what a conversion would change."""
    return conn.execute(
        "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE connamespace = 'public'::regnamespace UNION ALL "
        "SELECT polrelid::regclass::text, polname, pg_get_expr(polqual, polrelid) FROM pg_policy "
        "ORDER BY 1, 2"
    ).fetchall()


def test_distribute_on_a_server_without_citus_says_so_and_changes_nothing(
    cli: CliRunner, database_url: str
) -> None:
    with psycopg.connect(_libpq(database_url)) as conn:
        before = _schema_state(conn)
    checked = cli.invoke(app, ["db", "distribute", "--check"])
    result = cli.invoke(app, ["db", "distribute"])
    with psycopg.connect(_libpq(database_url)) as conn:
        after = _schema_state(conn)
    assert result.exit_code == 1 and checked.exit_code == 1
    assert "not a Citus coordinator" in result.output
    assert "nothing was changed" in result.output
    assert after == before


def test_the_plan_places_every_table_of_the_schema_once(database_url: str) -> None:
    plan = distribution.STORE_PLAN
    with psycopg.connect(_libpq(database_url)) as conn:
        found = distribution.blockers(conn, plan)
        tables = {
            row[0]
            for row in conn.execute(
                "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace "
                "AND relkind = 'r'"
            ).fetchall()
        }
    assert [b for b in found if b.kind is BlockerKind.UNPLANNED_TABLE] == []
    assert len(plan.tables) == len(set(plan.tables))
    assert set(plan.tables) == tables


def test_the_collection_decides_the_tenant_for_the_planner(database_url: str) -> None:
    """Migration 0031: functional-dependency statistics on (collection_id, tenant_id), so a
    search naming both is estimated as one naming the collection alone."""
    with psycopg.connect(_libpq(database_url)) as conn:
        rows = conn.execute(
            "SELECT s.stxname, c.relname, s.stxkind::text FROM pg_statistic_ext s "
            "JOIN pg_class c ON c.oid = s.stxrelid ORDER BY 1"
        ).fetchall()
    assert ("chunks_collection_tenant", "chunks", "{f}") in rows
    assert ("documents_collection_tenant", "documents", "{f}") in rows
