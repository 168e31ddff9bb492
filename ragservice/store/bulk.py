"""Bulk writes: binary COPY on the session's own psycopg connection."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import psycopg

from ragservice.db.engine import IS_CITUS


def insert_rows(
    conn: psycopg.Connection[Any],
    table: str,
    columns: Sequence[str],
    types: Sequence[str],
    rows: Sequence[tuple[Any, ...]],
) -> None:
    """Bulk-insert `rows`: binary COPY into a temporary table, then one INSERT from it.

    PostgreSQL refuses COPY FROM into a table under row-level security, so the rows are
    staged where no policy applies and the INSERT checks each against the table's policy."""
    if not rows:
        return
    sql = psycopg.sql
    target, staging = sql.Identifier(table), sql.Identifier(f"copy_{table}")
    names = sql.SQL(", ").join(map(sql.Identifier, columns))
    conn.execute(sql.SQL("DROP TABLE IF EXISTS pg_temp.{}").format(staging))
    conn.execute(
        sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA").format(
            staging, names, target
        )
    )
    copy_rows(conn, f"copy_{table}", columns, types, rows)
    # On Citus a plain INSERT ... SELECT becomes a COPY into the shards, which their policies
    # refuse the same way; with RETURNING the rows go through an intermediate result and an
    # INSERT on each worker instead.
    returning = sql.SQL(" RETURNING 1" if on_citus(conn) else "")
    conn.execute(
        sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}{}").format(
            target, names, names, staging, returning
        )
    )


_CITUS: weakref.WeakKeyDictionary[psycopg.Connection[Any], bool] = weakref.WeakKeyDictionary()


def on_citus(conn: psycopg.Connection[Any]) -> bool:
    """Whether `conn`'s database is a Citus coordinator (asked once per connection)."""
    known = _CITUS.get(conn)
    if known is None:
        row = conn.execute(IS_CITUS)
        known = bool(row.fetchone()[0])  # type: ignore[index]
        _CITUS[conn] = known
    return known


def copy_rows(
    conn: psycopg.Connection[Any],
    table: str,
    columns: Sequence[str],
    types: Sequence[str],
    rows: Sequence[tuple[Any, ...]],
) -> None:
    """Binary COPY of `rows` into `table` (one without row-level security)."""
    statement = psycopg.sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        psycopg.sql.Identifier(table),
        psycopg.sql.SQL(", ").join(map(psycopg.sql.Identifier, columns)),
    )
    with conn.cursor() as cur, cur.copy(statement) as copy:
        copy.set_types(list(types))
        for row in rows:
            copy.write_row(row)
