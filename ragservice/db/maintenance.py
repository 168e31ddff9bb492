"""`ragservice db optimize`: the big tables packed and analyzed, as the database owner.

`optimize_steps()` is the one list of what an optimize does, in order; each step is one
statement run outside a transaction (VACUUM cannot run in one) and the bytes of its table
(with indexes and TOAST) are measured before and after it. The postings are rewritten in the
order of their primary key (`CLUSTER`): the blocks of one lexeme then sit on neighbouring pages,
which the exact BM25 search reads a term at a time. The rewrite holds an ACCESS EXCLUSIVE lock:
searches wait for it (about 45 s for the postings of a million chunks), so an optimize belongs
after a large load or out of hours.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, text

from ragservice.errors import PermissionDeniedError

OWNED_TABLE = "chunk_postings"
"""Whoever owns this table (or a superuser) may optimize."""


@dataclass(frozen=True, slots=True)
class Step:
    """One statement of an optimize and the table whose bytes it changes."""

    label: str
    table: str
    statement: str


@dataclass(frozen=True, slots=True)
class StepResult:
    step: Step
    bytes_before: int
    bytes_after: int
    seconds: float


def optimize_steps() -> list[Step]:
    """What `ragservice db optimize` runs, in order."""
    return [
        Step(
            "merge the short BM25 postings blocks",
            "chunk_postings",
            "SELECT count(*) FROM collections c, ragservice_pack_postings(c.id)",
        ),
        Step(
            "pack the BM25 postings in key order",
            "chunk_postings",
            "CLUSTER chunk_postings USING chunk_postings_pkey",
        ),
        Step("analyze the BM25 postings", "chunk_postings", "ANALYZE chunk_postings"),
        Step("vacuum and analyze the chunks", "chunks", "VACUUM (ANALYZE) chunks"),
        Step(
            "vacuum and analyze the embeddings",
            "chunk_embeddings",
            "VACUUM (ANALYZE) chunk_embeddings",
        ),
        Step("vacuum and analyze the documents", "documents", "VACUUM (ANALYZE) documents"),
    ]


_OWNER = text(
    "SELECT current_user, r.rolsuper OR pg_has_role(current_user, c.relowner, 'USAGE'), "
    "pg_get_userbyid(c.relowner) "
    "FROM pg_roles r LEFT JOIN pg_class c ON c.oid = to_regclass(:table) "
    "WHERE r.rolname = current_user"
)


def check_owner(conn: Connection) -> str:
    """The connected role's name when it owns `OWNED_TABLE` (or is a superuser), else
    PermissionDeniedError naming the owner."""
    row = conn.execute(_OWNER, {"table": OWNED_TABLE}).one()
    role, owns, owner = str(row[0]), bool(row[1]), row[2]
    if not owns:
        raise PermissionDeniedError(
            f"role {role} does not own {OWNED_TABLE} (its owner is {owner}): run `ragservice db "
            "optimize` as the database owner (RAGSERVICE_OWNER_DATABASE_URL)"
        )
    return role


def run_optimize(
    engine: Engine,
    *,
    on_start: Callable[[Step], None] | None = None,
    on_done: Callable[[StepResult], None] | None = None,
) -> list[StepResult]:
    """Run `optimize_steps()` on `engine` (the owner's: `check_owner` first), telling
    `on_start` and `on_done` about each step."""
    results = []
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        check_owner(conn)
        for step in optimize_steps():
            if on_start is not None:
                on_start(step)
            before = table_bytes(conn, step.table)
            started = time.perf_counter()
            conn.execute(text(step.statement))
            result = StepResult(
                step, before, table_bytes(conn, step.table), time.perf_counter() - started
            )
            results.append(result)
            if on_done is not None:
                on_done(result)
    return results


def table_bytes(conn: Connection, table: str) -> int:
    """A table's bytes with its indexes and TOAST (0 when it does not exist)."""
    size = conn.execute(
        text("SELECT pg_total_relation_size(to_regclass(:table))"), {"table": table}
    ).scalar()
    return int(size or 0)
