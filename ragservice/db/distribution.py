"""Spreading the store over a Citus cluster: which table goes where, what in the schema stands
in the way, and the conversion itself (`ragservice db distribute`).

The plan (`STORE_PLAN`) puts every table of the schema in one of three places:
- reference tables, copied whole to every node: the small global tables read by every tenant's
  queries (tenants, models, API keys);
- distributed tables, split by `tenant_id` into co-located shards, so that all of one tenant's
  rows (collections, documents, chunks, vectors, postings, logs) live on one worker and a
  tenant's query runs there as one task;
- tables kept on the coordinator: the job queue (claimed across tenants with row locks and
  advisory locks, which stay local there), the operator's audit trail and Alembic's version.

Citus asks more of a schema than PostgreSQL does, and `blockers()` reads the live catalog for
each rule (all checked on a real cluster; see docs/scaling.md):
- every distributed table has the distribution column, and each of its primary keys and unique
  constraints includes it;
- a foreign key between distributed tables includes the distribution column on both sides, and
  no reference or coordinator table points at a distributed one;
- a row-level security policy contains no subquery ("Subqueries are not supported in policies
  on distributed tables");
- no policy of a distributed table is restrictive (Citus gives the shards every policy as a
  permissive one, so a restrictive policy would widen what they show);
- a trigger on a distributed table reads no transition table (a trigger fired on a shard cannot
  see its `REFERENCING NEW TABLE` rows from a distributed statement).

`distribute()` changes nothing while any blocker remains: it lists them instead. Otherwise it
converts the tables in foreign-key order, skipping those already converted (so a run that was
interrupted is simply run again), and reports each step as it goes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import psycopg
from psycopg import sql

from ragservice.db import citus_schema
from ragservice.errors import ConfigurationError, ConflictError

log = logging.getLogger(__name__)

DISTRIBUTION_COLUMN = "tenant_id"


class Placement(StrEnum):
    REFERENCE = "reference"
    DISTRIBUTED = "distributed"
    COORDINATOR = "coordinator"


@dataclass(frozen=True)
class DistributionPlan:
    """Where each table goes. `distributed` is in foreign-key order: the first is the table
    the others are co-located with."""

    reference: Sequence[str]
    distributed: Sequence[str]
    coordinator: Sequence[str]
    column: str = DISTRIBUTION_COLUMN
    schema: str = "public"
    released_keys: Sequence[str] = ()
    """Foreign keys from coordinator tables to distributed ones (which Citus cannot keep) that
    the conversion drops: the store does what their ON DELETE did itself."""

    def placement(self, table: str) -> Placement | None:
        if table in self.reference:
            return Placement.REFERENCE
        if table in self.distributed:
            return Placement.DISTRIBUTED
        if table in self.coordinator:
            return Placement.COORDINATOR
        return None

    @property
    def tables(self) -> list[str]:
        return [*self.reference, *self.distributed, *self.coordinator]


STORE_PLAN = DistributionPlan(
    reference=(
        "tenants",
        "embedding_models",
        "reranker_models",
        "model_activations",
        "api_keys",
        "analyst_tenants",
    ),
    distributed=(
        "collections",
        "documents",
        "chunks",
        "chunk_embeddings",
        "chunk_postings",
        "collection_text_stats",
        "group_members",
        "sources",
        "source_items",
        "query_log",
        "feedback",
        "prompt_cache",
        "prompt_cache_sources",
    ),
    # The job queue stays on the coordinator: workers claim across tenants with SELECT ... FOR
    # UPDATE SKIP LOCKED and check their claims' advisory locks in pg_locks, both local.
    coordinator=("ingest_jobs", "ingest_job_items", "audit_log", "alembic_version"),
    # store.collections.delete_collection deletes a collection's jobs; store.sources.delete_source
    # clears its jobs' source_id.
    released_keys=("ingest_jobs_collection_id_fkey", "ingest_jobs_source_id_fkey"),
)


class BlockerKind(StrEnum):
    UNPLANNED_TABLE = "unplanned table"
    NO_DISTRIBUTION_COLUMN = "no distribution column"
    UNIQUE_WITHOUT_COLUMN = "unique key without the distribution column"
    FOREIGN_KEY = "foreign key"
    POLICY_SUBQUERY = "policy with a subquery"
    RESTRICTIVE_POLICY = "restrictive policy"
    TRANSITION_TABLE_TRIGGER = "trigger reading a transition table"


@dataclass(frozen=True, order=True)
class Blocker:
    """One thing in the live schema that Citus would refuse or run wrongly."""

    table: str
    kind: BlockerKind
    name: str
    detail: str

    def describe(self) -> str:
        return f"{self.table}: {self.kind} {self.name} ({self.detail})"


@dataclass(frozen=True)
class Step:
    """One conversion: a table made a reference or distributed table."""

    table: str
    placement: Placement
    done_before: bool = False


@dataclass
class DistributionReport:
    steps: list[Step] = field(default_factory=list)
    released_keys: list[str] = field(default_factory=list)
    """The plan's released foreign keys this run dropped."""

    @property
    def converted(self) -> list[str]:
        return [s.table for s in self.steps if not s.done_before]


class NotCitusError(ConfigurationError):
    """The server is not a Citus coordinator."""


class DistributionBlockedError(ConflictError):
    """The schema has something Citus cannot distribute; nothing was changed."""

    def __init__(self, blockers: Sequence[Blocker]) -> None:
        self.blockers = list(blockers)
        lines = "\n".join(f"  - {b.describe()}" for b in self.blockers)
        super().__init__(
            f"the schema cannot be distributed yet; {len(self.blockers)} blockers, nothing "
            f"was changed:\n{lines}"
        )


# --- reading the cluster and the catalog -----------------------------------------------------

_CITUS_VERSION = "SELECT extversion FROM pg_extension WHERE extname = 'citus'"
_WORKERS = "SELECT count(*) FROM pg_dist_node WHERE noderole = 'primary' AND groupid <> 0"
_CONVERTED = (
    "SELECT c.relname, p.partmethod FROM pg_dist_partition p "
    "JOIN pg_class c ON c.oid = p.logicalrelid "
    "WHERE c.relnamespace = %s::regnamespace AND c.relname = ANY(%s)"
)
_TABLES = (
    "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND NOT c.relispartition "
    "ORDER BY c.relname"
)
_MISSING_COLUMN = (
    "SELECT t FROM unnest(%s::text[]) AS t WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a "
    "WHERE a.attrelid = to_regclass(quote_ident(%s) || '.' || quote_ident(t)) AND a.attname = %s "
    "AND NOT a.attisdropped)"
)
# Unique indexes (those of primary keys and unique constraints included) whose keys leave out
# the distribution column.
_UNIQUE_WITHOUT_COLUMN = """
SELECT c.relname, i.relname, pg_get_indexdef(x.indexrelid)
FROM pg_index x JOIN pg_class c ON c.oid = x.indrelid JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND x.indisunique AND c.relname = ANY(%s)
  AND NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = %s
                  AND a.attnum = ANY(x.indkey[0:x.indnkeyatts - 1]))
ORDER BY 1, 2"""
_FOREIGN_KEYS = """
SELECT c.relname, f.relname, k.conname, pg_get_constraintdef(k.oid),
       EXISTS (SELECT 1 FROM unnest(k.conkey, k.confkey) AS u(l, r)
               JOIN pg_attribute la ON la.attrelid = k.conrelid AND la.attnum = u.l
               JOIN pg_attribute ra ON ra.attrelid = k.confrelid AND ra.attnum = u.r
               WHERE la.attname = %s AND ra.attname = %s)
FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid JOIN pg_class f ON f.oid = k.confrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE k.contype = 'f' AND n.nspname = %s
ORDER BY 1, 3"""
# A policy's expressions as stored node trees: a subquery is a SubLink node.
_POLICIES_WITH_SUBQUERIES = """
SELECT c.relname, p.polname FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
WHERE c.relnamespace = %s::regnamespace AND c.relname = ANY(%s)
  AND (coalesce(p.polqual::text, '') LIKE '%%{SUBLINK%%'
       OR coalesce(p.polwithcheck::text, '') LIKE '%%{SUBLINK%%')
ORDER BY 1, 2"""
# Citus gives a distributed table's shards its policies as permissive ones.
_RESTRICTIVE_POLICIES = """
SELECT c.relname, p.polname FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
WHERE c.relnamespace = %s::regnamespace AND c.relname = ANY(%s) AND NOT p.polpermissive
ORDER BY 1, 2"""
_TRANSITION_TRIGGERS = """
SELECT c.relname, t.tgname, pg_get_functiondef(t.tgfoid)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE NOT t.tgisinternal AND c.relnamespace = %s::regnamespace AND c.relname = ANY(%s)
  AND (t.tgnewtable IS NOT NULL OR t.tgoldtable IS NOT NULL)
ORDER BY 1, 2"""


def citus_version(conn: psycopg.Connection[Any]) -> str | None:
    """The Citus extension's version in this database, or None when it has none."""
    row = conn.execute(_CITUS_VERSION).fetchone()
    return None if row is None else str(row[0])


def require_coordinator(conn: psycopg.Connection[Any]) -> str:
    """The Citus version; NotCitusError (with what to do) on a server without Citus or
    without workers."""
    version = citus_version(conn)
    if version is None:
        raise NotCitusError(
            "this PostgreSQL server is not a Citus coordinator (no citus extension in its "
            "database); nothing was changed. Point RAGSERVICE_OWNER_DATABASE_URL at the "
            "coordinator of a Citus cluster (docs/scaling.md)"
        )
    workers = int(conn.execute(_WORKERS).fetchone()[0])  # type: ignore[index]
    if workers == 0:
        raise NotCitusError(
            f"the Citus coordinator (citus {version}) has no workers; add them with "
            "citus_add_node() first (docs/scaling.md); nothing was changed"
        )
    return version


def converted_tables(conn: psycopg.Connection[Any], plan: DistributionPlan) -> dict[str, str]:
    """The plan's tables Citus already manages: name → partition method ('h' distributed,
    'n' reference or local)."""
    rows = conn.execute(_CONVERTED, (plan.schema, list(plan.tables))).fetchall()
    return {str(name): str(method) for name, method in rows}


def blockers(conn: psycopg.Connection[Any], plan: DistributionPlan = STORE_PLAN) -> list[Blocker]:
    """Everything in the live schema that stands in the way of `plan` (see the module's
    docstring), sorted by table."""
    found: list[Blocker] = []
    schema = plan.schema
    tables = [str(row[0]) for row in conn.execute(_TABLES, (schema,)).fetchall()]
    for table in tables:
        if plan.placement(table) is None:
            found.append(
                Blocker(table, BlockerKind.UNPLANNED_TABLE, table, "the plan does not place it")
            )
    distributed = [t for t in plan.distributed if t in tables]
    for (table,) in conn.execute(_MISSING_COLUMN, (distributed, schema, plan.column)).fetchall():
        found.append(
            Blocker(table, BlockerKind.NO_DISTRIBUTION_COLUMN, plan.column, "add the column")
        )
    for table, index, definition in conn.execute(
        _UNIQUE_WITHOUT_COLUMN, (schema, distributed, plan.column)
    ).fetchall():
        found.append(Blocker(table, BlockerKind.UNIQUE_WITHOUT_COLUMN, index, definition))
    found.extend(_foreign_key_blockers(conn, plan))
    for table, policy in conn.execute(_POLICIES_WITH_SUBQUERIES, (schema, list(plan.tables))):
        found.append(Blocker(table, BlockerKind.POLICY_SUBQUERY, policy, "use no subquery"))
    for table, policy in conn.execute(_RESTRICTIVE_POLICIES, (schema, distributed)).fetchall():
        found.append(
            Blocker(table, BlockerKind.RESTRICTIVE_POLICY, policy, "Citus makes it permissive")
        )
    triggers = conn.execute(_TRANSITION_TRIGGERS, (schema, distributed)).fetchall()
    for table, trigger, definition in triggers:
        if citus_schema.writes_shards_only(definition, plan):
            continue
        found.append(
            Blocker(table, BlockerKind.TRANSITION_TABLE_TRIGGER, trigger, "read no new/old table")
        )
    return sorted(found)


def _foreign_key_blockers(conn: psycopg.Connection[Any], plan: DistributionPlan) -> list[Blocker]:
    found: list[Blocker] = []
    rows = conn.execute(_FOREIGN_KEYS, (plan.column, plan.column, plan.schema)).fetchall()
    for table, target, name, definition, on_column in rows:
        source, referenced = plan.placement(table), plan.placement(target)
        if source is None or referenced is None:
            continue  # the table itself is reported as unplanned
        if referenced is Placement.DISTRIBUTED and source is not Placement.DISTRIBUTED:
            if source is Placement.COORDINATOR and name in plan.released_keys:
                continue
            why = f"a {source} table cannot reference distributed {target}: {definition}"
        elif source is Placement.DISTRIBUTED and referenced is Placement.DISTRIBUTED:
            if on_column:
                continue
            why = f"{plan.column} on both sides needed: {definition}"
        elif source is Placement.REFERENCE and referenced is Placement.COORDINATOR:
            why = f"a reference table cannot reference a coordinator table: {definition}"
        else:
            continue
        found.append(Blocker(table, BlockerKind.FOREIGN_KEY, name, why))
    return found


# --- the conversion --------------------------------------------------------------------------

Progress = Callable[[Step, int, int], None]
"""Called after each step with the step, its number (from 1) and the number of steps."""


def distribute(
    conn: psycopg.Connection[Any],
    plan: DistributionPlan = STORE_PLAN,
    *,
    progress: Progress | None = None,
) -> DistributionReport:
    """Convert the store's tables as `plan` says, on a Citus coordinator (`conn` as the tables'
    owner, autocommit). NotCitusError or DistributionBlockedError before any change; tables
    already converted are skipped, so running it again finishes an interrupted run.

    Everything happens in one transaction: the schema made ready for Citus (`citus_schema`),
    checked, and the tables converted; an interrupted run leaves the schema as it was."""
    require_coordinator(conn)
    done = converted_tables(conn, plan)
    ordered = [(t, Placement.REFERENCE) for t in plan.reference] + [
        (t, Placement.DISTRIBUTED) for t in plan.distributed
    ]
    report = DistributionReport()
    anchor = plan.distributed[0] if plan.distributed else None
    with conn.transaction():
        conn.execute("SET LOCAL citus.multi_shard_modify_mode = 'sequential'")
        _make_ready(conn, plan)
        found = blockers(conn, plan)
        if found:
            raise DistributionBlockedError(found)
        # Citus refuses a distributed table that a table not yet converted references: the
        # foreign keys between the plan's tables are set aside and made again at the end.
        pending = [t for t, _ in ordered if t not in done]
        keys = _set_aside_foreign_keys(conn, plan, pending)
        # Citus copies each table's rows into its shards: its triggers must not fire for them
        # (the rows were counted when first written).
        _set_triggers(conn, plan, pending, enabled=False)
        for number, (table, placement) in enumerate(ordered, start=1):
            step = Step(table, placement, done_before=table in done)
            if not step.done_before:
                _convert(conn, plan, table, placement, anchor)
            report.steps.append(step)
            if progress is not None:
                progress(step, number, len(ordered))
        _set_triggers(conn, plan, pending, enabled=True)
        for table, name, definition in keys:
            if name in plan.released_keys:
                report.released_keys.append(name)
                continue
            conn.execute(
                sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(
                    sql.Identifier(plan.schema, table),
                    sql.Identifier(name),
                    sql.SQL(citus_foreign_key(definition)),
                )
            )
    return report


_SET_ON_DELETE = re.compile(r"\s+ON DELETE SET (?:NULL|DEFAULT)(?:\s*\([^)]*\))?")


def citus_foreign_key(definition: str) -> str:
    """A foreign key's definition as Citus takes it: without ON DELETE SET NULL / SET DEFAULT,
    which Citus refuses on a key that includes the distribution column (the store clears such
    references itself before it deletes the row they point at)."""
    return _SET_ON_DELETE.sub("", definition)


def _set_triggers(
    conn: psycopg.Connection[Any], plan: DistributionPlan, tables: Sequence[str], *, enabled: bool
) -> None:
    action = sql.SQL("ENABLE" if enabled else "DISABLE")
    for table in tables:
        conn.execute(
            sql.SQL("ALTER TABLE {} {} TRIGGER USER").format(
                sql.Identifier(plan.schema, table), action
            )
        )


def check(conn: psycopg.Connection[Any], plan: DistributionPlan = STORE_PLAN) -> list[Blocker]:
    """What would stop `distribute` now, once the schema is made ready for Citus (that is
    tried and rolled back: nothing changes). NotCitusError on a server without Citus."""
    require_coordinator(conn)
    found: list[Blocker] = []
    with conn.transaction(force_rollback=True):
        _make_ready(conn, plan)
        found = blockers(conn, plan)
    return found


def _make_ready(conn: psycopg.Connection[Any], plan: DistributionPlan) -> None:
    # Citus copies a distributed table's triggers to its shards only when told to; the
    # trigger functions are rewritten to write the co-located shards (`citus_schema`).
    conn.execute("SET LOCAL citus.enable_unsafe_triggers = on")
    citus_schema.rewrite_policies(conn, plan)
    citus_schema.rewrite_readers_policies(conn, plan)
    citus_schema.fold_restrictive_policies(conn, plan)
    citus_schema.rewrite_trigger_functions(conn, plan)
    citus_schema.allow_worker_logins(conn)
    citus_schema.define_tenant_bm25(conn, plan)
    citus_schema.wrap_analytics_views(conn)


_KEYS_OF = """
SELECT c.relname, k.conname, pg_get_constraintdef(k.oid)
FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid JOIN pg_class f ON f.oid = k.confrelid
WHERE k.contype = 'f' AND c.relnamespace = %s::regnamespace
  AND (c.relname = ANY(%s) OR f.relname = ANY(%s))
ORDER BY 1, 2"""


def _set_aside_foreign_keys(
    conn: psycopg.Connection[Any], plan: DistributionPlan, pending: Sequence[str]
) -> list[tuple[str, str, str]]:
    """Drop the foreign keys from or to the tables still to convert: (table, name,
    definition) of each, to be made again."""
    keys = [
        (str(table), str(name), str(definition))
        for table, name, definition in conn.execute(
            _KEYS_OF, (plan.schema, list(pending), list(pending))
        ).fetchall()
    ]
    for table, name, _ in keys:
        conn.execute(
            sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(
                sql.Identifier(plan.schema, table), sql.Identifier(name)
            )
        )
    return keys


def _convert(
    conn: psycopg.Connection[Any],
    plan: DistributionPlan,
    table: str,
    placement: Placement,
    anchor: str | None,
) -> None:
    name = sql.Literal(sql.Identifier(plan.schema, table).as_string(conn))
    if placement is Placement.REFERENCE:
        conn.execute(sql.SQL("SELECT create_reference_table({}::regclass)").format(name))
    else:
        colocate = (
            "default"
            if anchor is None or anchor == table
            else sql.Identifier(plan.schema, anchor).as_string(conn)
        )
        conn.execute(
            sql.SQL(
                "SELECT create_distributed_table({}::regclass, {}, colocate_with => {})"
            ).format(name, sql.Literal(plan.column), sql.Literal(colocate))
        )
    log.info("%s is now a %s table", table, placement)
