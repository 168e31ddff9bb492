"""Searching for an asker who may not read every document of its tenant: row-level security
hides the chunks it may not read from every statement (migration 0026), so the statements that
cut a ranking short before that check (the exact BM25 extension's top k, the score cut) are
asked for more, and deeper while too few of what they return is visible."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from ragservice.db import tenancy

DEPTH_FACTOR = 20
"""Exact full text asks the extension for this many times the chunks it wants (then keeps the
visible ones), deepening eightfold while too few are visible (benchmarks/permissions.py: at a
10 % share, 20 times was enough for 99 of 100 queries)."""
MAX_DEPTH = 100_000
"""The deepest top the extension gives (its MAX_K); a query that still finds fewer visible
chunks than wanted returns those (a query with fewer matches than wanted reads that deep too:
each step of a query with few postings is cheap)."""


def restricted() -> bool:
    """Whether the current transaction may not read every document of its tenant."""
    return tenancy.current().restricted


def first_depth(limit: int) -> int:
    return min(limit * DEPTH_FACTOR, MAX_DEPTH)


def deepened(
    conn: psycopg.Connection[Any],
    query: sql.Composed,
    params: dict[str, Any],
    rows: list[tuple[Any, ...]],
    wanted: int,
) -> list[tuple[Any, ...]]:
    """`rows`, or while fewer than `wanted`, the rows of `query` run deeper (`%(depth)s`, in
    steps of eight: exact all along, only the depth changes)."""
    while len(rows) < wanted and params["depth"] < MAX_DEPTH:
        params = params | {"depth": min(params["depth"] * 8, MAX_DEPTH)}
        rows = conn.execute(query, params, prepare=False).fetchall()
    return rows
