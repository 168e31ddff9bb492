"""What `ragservice db distribute` changes in the schema so that Citus can run it, before the
tables are converted (in the same transaction: nothing stays changed when a step fails).

- **Policies without subqueries.** The row-level security policies read the transaction's
  tenant and readers through `(SELECT ragservice_current_tenant())`-style subqueries, so that
  plain PostgreSQL evaluates each setting once per statement (an init plan). Citus refuses any
  subquery in a policy of a distributed or reference table; on Citus the policies call the same
  functions directly (evaluated per row: a setting lookup).
- **Logins on the workers.** A Citus coordinator connects to the workers as the current role.
  The service works as `ragservice_service` and, across tenants, `ragservice_system` (`SET
  ROLE`), both made NOLOGIN by the migrations; on Citus they must be able to log in, which Citus
  carries over to every node. They have no password: a node lets them in only where its
  pg_hba.conf trusts the coordinator or `pg_dist_authinfo` gives them one (docs/scaling.md).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

if TYPE_CHECKING:
    from ragservice.db.distribution import DistributionPlan

log = logging.getLogger(__name__)

SWITCHED_ROLES = ("ragservice_service", "ragservice_system")
"""The roles the service's login switches to (migrations 0007 and 0010)."""

# `( SELECT ragservice_current_tenant() AS ragservice_current_tenant)`, as PostgreSQL prints a
# scalar subquery calling one of the settings' functions; schema-qualified or not.
_SETTING_SUBQUERY = re.compile(
    r"\( SELECT (?P<schema>public\.)?(?P<function>ragservice_[a-z_]+)\(\) AS (?P=function)\)"
)

_POLICIES = """
SELECT c.relname, p.polname, pg_get_expr(p.polqual, p.polrelid),
       pg_get_expr(p.polwithcheck, p.polrelid)
FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
WHERE c.relnamespace = %s::regnamespace AND c.relname = ANY(%s)
ORDER BY 1, 2"""


@dataclass(frozen=True)
class RewrittenPolicy:
    table: str
    name: str
    using: str | None
    check: str | None


def without_setting_subqueries(expression: str | None) -> str | None:
    """`expression` with each settings subquery replaced by a direct call of its function."""
    if expression is None:
        return None
    return _SETTING_SUBQUERY.sub(
        lambda m: f"{m.group('schema') or ''}{m.group('function')}()", expression
    )


def rewrite_policies(
    conn: psycopg.Connection[Any], plan: DistributionPlan
) -> list[RewrittenPolicy]:
    """Call the settings' functions directly in every policy of the plan's tables that wraps
    them in a subquery; the policies changed. Other subqueries are left for `blockers()`."""
    changed: list[RewrittenPolicy] = []
    rows = conn.execute(_POLICIES, (plan.schema, list(plan.tables))).fetchall()
    for table, name, using, check in rows:
        new_using, new_check = without_setting_subqueries(using), without_setting_subqueries(check)
        if (new_using, new_check) == (using, check):
            continue
        clauses = []
        if new_using is not None:
            clauses.append(sql.SQL("USING ({})").format(sql.SQL(new_using)))
        if new_check is not None:
            clauses.append(sql.SQL("WITH CHECK ({})").format(sql.SQL(new_check)))
        conn.execute(
            sql.SQL("ALTER POLICY {} ON {} {}").format(
                sql.Identifier(name), sql.Identifier(plan.schema, table), sql.SQL(" ").join(clauses)
            )
        )
        changed.append(RewrittenPolicy(table, name, new_using, new_check))
    log.info("%d policies call the settings' functions directly", len(changed))
    return changed


def allow_worker_logins(
    conn: psycopg.Connection[Any], roles: tuple[str, ...] = SWITCHED_ROLES
) -> list[str]:
    """Let the roles the service switches to log in (Citus connects to the workers as them);
    the roles changed."""
    changed = []
    for role in roles:
        row = conn.execute(
            "SELECT rolcanlogin FROM pg_roles WHERE rolname = %s", (role,)
        ).fetchone()
        if row is None or row[0]:
            continue
        conn.execute(sql.SQL("ALTER ROLE {} LOGIN").format(sql.Identifier(role)))
        changed.append(role)
    return changed


# --- triggers that write their co-located shards --------------------------------------------
#
# On Citus a distributed table's triggers fire on its shards, on the workers. A statement in
# the trigger that names another distributed table is planned there as a distributed query,
# which cannot see the trigger's transition tables ("executor could not find named
# tuplestore") and may not run inside a shard's query anyway. So on Citus each such statement
# names the co-located shards instead: the shard of the target table that holds the same
# tenants as the shard the trigger fired on (Citus's advice for triggers on distributed tables).

LOCAL_TABLE_FUNCTION = "ragservice_local_table"
_LOCAL_TABLE = """
CREATE OR REPLACE FUNCTION public.ragservice_local_table(firing name, schema name, target text)
RETURNS text LANGUAGE plpgsql STABLE AS $body$
DECLARE
    shard bigint := substring(firing from '_([0-9]+)$')::bigint;
    colocated bigint;
BEGIN
    IF shard IS NULL THEN  -- fired on the table itself, not on a shard
        RETURN format('%I.%I', schema, target);
    END IF;
    SELECT t.shardid INTO colocated
    FROM pg_dist_shard f
    JOIN pg_dist_shard t ON t.logicalrelid = format('%I.%I', schema, target)::regclass
     AND t.shardminvalue IS NOT DISTINCT FROM f.shardminvalue
    WHERE f.shardid = shard;
    IF colocated IS NULL THEN
        RAISE EXCEPTION 'no shard of % is co-located with shard %', target, shard;
    END IF;
    RETURN format('%I.%I', schema, target || '_' || colocated);
END $body$"""

_TRIGGER_FUNCTIONS = """
SELECT DISTINCT p.oid::regprocedure::text, pg_get_functiondef(p.oid)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_proc p ON p.oid = t.tgfoid
WHERE NOT t.tgisinternal AND c.relnamespace = %s::regnamespace AND c.relname = ANY(%s)
ORDER BY 1"""

_CONTROL = re.compile(
    r"\A(\s*(?:(?:IF|ELSIF)\b.*?\bTHEN\b|ELSE\b|END\s+IF\s*;|BEGIN\b))", re.DOTALL | re.IGNORECASE
)
_SQL_START = re.compile(r"\A\s*(WITH|INSERT|UPDATE|DELETE|SELECT)\b", re.IGNORECASE)
_DOLLAR_BODY = re.compile(r"AS (\$[A-Za-z_]*\$)(.*)\1", re.DOTALL)
_MARK = "$ragservice_shard$"


class UnsupportedTriggerError(ValueError):
    """A trigger function this module cannot rewrite for shards."""


def shard_local_body(body: str, tables: tuple[str, ...], schema: str = "public") -> str:
    """A PL/pgSQL trigger body whose SQL statements naming any of `tables` run through EXECUTE
    with each such name replaced by `ragservice_local_table(TG_TABLE_NAME, TG_TABLE_SCHEMA,
    name)`: the table
    itself where the trigger fires on a table, the co-located shard where it fires on a
    shard. Other statements stay as they are."""
    names = re.compile(
        rf"(?<![.\w])(?:{re.escape(schema)}\.)?(" + "|".join(map(re.escape, tables)) + r")(?!\w)"
    )
    head, begin, rest = _split_declarations(body)
    variables = set(re.findall(r"^\s*(\w+)\s+\w", head.split("DECLARE", 1)[-1], re.MULTILINE))
    out: list[str] = [head, begin]
    for statement in _statements(rest):
        prefix = ""
        while (control := _CONTROL.match(statement)) is not None:
            prefix += control.group(1)
            statement = statement[control.end() :]
        if _SQL_START.match(statement) and names.search(statement):
            used = {w for w in re.findall(r"\w+", statement) if w in variables}
            if used or _MARK in statement:
                raise UnsupportedTriggerError(f"a statement uses variables {sorted(used)}")
            statement = _executed(statement, names)
        out.append(prefix + statement)
    return "".join(out)


def _split_declarations(body: str) -> tuple[str, str, str]:
    match = re.search(r"\bBEGIN\b", body)
    if match is None:
        raise UnsupportedTriggerError("no BEGIN in the function's body")
    return body[: match.start()], "BEGIN", body[match.end() :]


def _statements(text: str) -> list[str]:
    """`text` cut after each semicolon outside parentheses and quotes (the last piece, the
    closing END, included as is)."""
    pieces, depth, quote, start = [], 0, "", 0
    for index, char in enumerate(text):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == ";" and depth == 0:
            pieces.append(text[start : index + 1])
            start = index + 1
    pieces.append(text[start:])
    return pieces


def _executed(statement: str, names: re.Pattern[str]) -> str:
    found: list[str] = []

    def placeholder(match: re.Match[str]) -> str:
        if match.group(1) not in found:
            found.append(match.group(1))
        return f"%{found.index(match.group(1)) + 1}$s"

    body = statement.rstrip().removesuffix(";")
    leading = body[: len(body) - len(body.lstrip())]
    text = names.sub(placeholder, body.strip().replace("%", "%%"))
    arguments = ", ".join(
        f"public.{LOCAL_TABLE_FUNCTION}(TG_TABLE_NAME, TG_TABLE_SCHEMA, '{name}')" for name in found
    )
    return f"{leading}EXECUTE format({_MARK}{text}{_MARK}, {arguments});"


def writes_shards_only(definition: str, plan: DistributionPlan) -> bool:
    """Whether a trigger function (`pg_get_functiondef`) names no other distributed table
    outside `ragservice_local_table` (as written, or once rewritten)."""
    match = _DOLLAR_BODY.search(definition)
    if match is None:
        return False
    try:
        body = match.group(2)
        return shard_local_body(body, tuple(plan.distributed), plan.schema) == body
    except UnsupportedTriggerError:
        return False


def rewrite_trigger_functions(conn: psycopg.Connection[Any], plan: DistributionPlan) -> list[str]:
    """Make `ragservice_local_table` and redefine every trigger function of the plan's
    distributed tables so that its statements write the co-located shards; the functions
    changed. Idempotent: a function already rewritten is left alone."""
    conn.execute(_LOCAL_TABLE)
    changed = []
    distributed = tuple(plan.distributed)
    rows = conn.execute(_TRIGGER_FUNCTIONS, (plan.schema, list(distributed))).fetchall()
    for signature, definition in rows:
        match = _DOLLAR_BODY.search(definition)
        if match is None:
            continue
        try:
            body = shard_local_body(match.group(2), distributed, plan.schema)
        except UnsupportedTriggerError as exc:
            log.warning("trigger function %s is not rewritten: %s", signature, exc)
            continue
        if body == match.group(2):
            continue
        rewritten = definition[: match.start(2)] + body + definition[match.end(2) :]
        conn.execute(rewritten)
        changed.append(str(signature))
    log.info("%d trigger functions write their co-located shards", len(changed))
    return changed


# --- the readers' policies of the logs and the cache -----------------------------------------
#
# A logged question, a cache entry and a verdict are shown to an asker only when the asker may
# read every document they came from: the policies (migration 0026) look the documents up in a
# subquery, which Citus refuses. On Citus the same test is a function that reads the shard of
# `documents` (or `query_log`) holding the row's tenant: co-located, so on the same worker.

_READERS_FUNCTIONS = (
    """
CREATE OR REPLACE FUNCTION public.ragservice_tenant_shard(target text, tenant uuid)
RETURNS text LANGUAGE sql STABLE AS $body$
    SELECT format('public.%I', target || '_' ||
                  get_shard_id_for_distribution_column(format('public.%I', target), tenant))
$body$""",
    """
CREATE OR REPLACE FUNCTION public.ragservice_reads_documents(tenant uuid, ids uuid[])
RETURNS boolean LANGUAGE plpgsql STABLE AS $body$
DECLARE
    visible boolean;
BEGIN
    IF coalesce(cardinality(ids), 0) = 0 THEN
        RETURN true;
    END IF;
    EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM unnest($1) AS s(id) WHERE NOT EXISTS '
                   '(SELECT 1 FROM %s d WHERE d.id = s.id AND d.tenant_id = $2))',
                   public.ragservice_tenant_shard('documents', tenant))
    INTO visible USING ids, tenant;
    RETURN visible;
END $body$""",
    """
CREATE OR REPLACE FUNCTION public.ragservice_retrieved_documents(retrieved jsonb)
RETURNS uuid[] LANGUAGE plpgsql IMMUTABLE AS $body$
BEGIN
    RETURN ARRAY(
        SELECT (r.hit ->> 'document_id')::uuid
        FROM jsonb_array_elements(CASE WHEN jsonb_typeof(retrieved) = 'array'
                                       THEN retrieved ELSE '[]'::jsonb END) AS r(hit));
END $body$""",
    """
CREATE OR REPLACE FUNCTION public.ragservice_sees_query(tenant uuid, query uuid)
RETURNS boolean LANGUAGE plpgsql STABLE AS $body$
DECLARE
    visible boolean;
BEGIN
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s q WHERE q.id = $1 AND q.tenant_id = $2)',
                   public.ragservice_tenant_shard('query_log', tenant))
    INTO visible USING query, tenant;
    RETURN visible;
END $body$""",
)

READERS_POLICIES = {
    "query_log": "public.ragservice_reads_all() OR public.ragservice_reads_documents(tenant_id, "
    "source_document_ids || public.ragservice_retrieved_documents(retrieved))",
    "prompt_cache": "public.ragservice_reads_all() OR "
    "public.ragservice_reads_documents(tenant_id, source_documents)",
    "feedback": "public.ragservice_reads_all() OR "
    "public.ragservice_sees_query(tenant_id, query_id)",
}
"""The `document_readers` policy of each table, as Citus runs it."""

_READERS_POLICY = """
SELECT pg_get_expr(p.polqual, p.polrelid) FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
WHERE c.relnamespace = 'public'::regnamespace AND c.relname = %s
  AND p.polname = 'document_readers'"""


# The asker's readers without a cast that could fail on its own: Citus evaluates the parts of a
# statement that read no column on the coordinator, each branch of a CASE included, and '*'
# (every document) is no array.
_CURRENT_READERS = """
CREATE OR REPLACE FUNCTION public.ragservice_current_readers() RETURNS text[]
LANGUAGE sql STABLE PARALLEL SAFE AS $body$
    SELECT (CASE WHEN coalesce(current_setting('ragservice.readers', true), '') IN ('', '*')
                 THEN '{}' ELSE current_setting('ragservice.readers', true) END)::text[]
$body$"""


def rewrite_readers_policies(conn: psycopg.Connection[Any], plan: DistributionPlan) -> list[str]:
    """Give the logs' and the cache's `document_readers` policies their Citus form (the store's
    own tables in `public` only); the tables changed."""
    if plan.schema != "public":
        return []
    conn.execute(_CURRENT_READERS)
    for statement in _READERS_FUNCTIONS:
        conn.execute(statement)
    changed = []
    for table, using in READERS_POLICIES.items():
        row = conn.execute(_READERS_POLICY, (table,)).fetchone()
        if table not in plan.distributed or row is None or row[0] is None or "SELECT" not in row[0]:
            continue
        conn.execute(
            sql.SQL("ALTER POLICY document_readers ON {} USING ({})").format(
                sql.Identifier("public", table), sql.SQL(using)
            )
        )
        changed.append(table)
    return changed


# --- restrictive policies ------------------------------------------------------------------
#
# Citus copies a distributed table's policies to its shards as permissive ones, whatever they
# were (checked: `document_readers`, AS RESTRICTIVE on the coordinator, is permissive on every
# shard), and it is the shards' policies that hold: a restrictive policy would then widen what
# the permissive one shows instead of narrowing it. On Citus each table's restrictive policies
# are folded into its one permissive policy: USING (permissive AND restrictive ...), WITH CHECK
# as it was. The tables kept on the coordinator too: the job queue refers to the reference
# table `tenants`, so Citus makes it a Citus-managed local table, whose policies it recreates
# the same way (found on the cluster: every job of another tenant that names no readers was
# shown through `ingest_jobs`' permissive `document_readers`).

_POLICY_KINDS = """
SELECT p.polname, p.polpermissive, p.polcmd, pg_get_expr(p.polqual, p.polrelid),
       pg_get_expr(p.polwithcheck, p.polrelid)
FROM pg_policy p WHERE p.polrelid = %s::regclass ORDER BY p.polpermissive DESC, p.polname"""


class UnfoldablePoliciesError(ValueError):
    """A table's policies are not one permissive policy for all commands plus restrictive
    ones that check nothing on write."""


def fold_restrictive_policies(conn: psycopg.Connection[Any], plan: DistributionPlan) -> list[str]:
    """Fold every restrictive policy of the plan's tables into the table's permissive one
    (see above); the tables changed."""
    changed = []
    for table in plan.tables:
        name = sql.Identifier(plan.schema, table).as_string(conn)
        rows = conn.execute(_POLICY_KINDS, (name,)).fetchall()
        restrictive = [row for row in rows if not row[1]]
        if not restrictive:
            continue
        permissive = [row for row in rows if row[1]]
        if len(permissive) != 1 or permissive[0][2] != "*":
            raise UnfoldablePoliciesError(f"{table}: not one permissive policy for all commands")
        keep, _, _, using, check = permissive[0]
        if any(row[2] != "*" or row[4] not in (None, "true") for row in restrictive):
            raise UnfoldablePoliciesError(f"{table}: a restrictive policy checks writes")
        folded = " AND ".join(
            f"({expression})" for expression in [using, *(r[3] for r in restrictive)]
        )
        conn.execute(
            sql.SQL("ALTER POLICY {} ON {} USING ({}) WITH CHECK ({})").format(
                sql.Identifier(keep),
                sql.Identifier(plan.schema, table),
                sql.SQL(folded),
                sql.SQL(check or using),
            )
        )
        for row in restrictive:
            conn.execute(
                sql.SQL("DROP POLICY {} ON {}").format(
                    sql.Identifier(row[0]), sql.Identifier(plan.schema, table)
                )
            )
        changed.append(table)
    return changed


# --- exact BM25 on the tenant's worker ---------------------------------------------------------
#
# A tenant's full-text search is one statement that names the tenant on every table, so Citus
# runs it on the worker that holds the tenant's shards. There `ragservice_bm25_topk`, which reads
# the distributed tables, would start a distributed query from within a shard's query (refused);
# `ragservice_bm25_topk_tenant` runs the extension's `ragservice_bm25_topk_in` over the shards of
# chunk_postings and collection_text_stats that hold the tenant instead. PL/pgSQL: a SQL function
# would be inlined, and Citus would evaluate the shards' names on the coordinator, where they are
# no tables.

TENANT_BM25_FUNCTION = "ragservice_bm25_topk_tenant"
_BM25_ON_TABLES = (
    "public.ragservice_bm25_topk_in(regclass, regclass, uuid[], text[], float8[], integer, "
    "float8, float8)"
)
_TENANT_BM25 = """
CREATE OR REPLACE FUNCTION public.ragservice_bm25_topk_tenant(
    tenant uuid, collections uuid[], terms text[], weights float8[], k integer, k1 float8,
    b float8
) RETURNS TABLE (seq bigint, score float8) LANGUAGE plpgsql STABLE ROWS 100 AS $body$
DECLARE
    postings regclass := to_regclass(public.ragservice_tenant_shard('chunk_postings', tenant));
    totals regclass := to_regclass(public.ragservice_tenant_shard('collection_text_stats', tenant));
BEGIN
    IF postings IS NULL OR totals IS NULL THEN
        RAISE EXCEPTION 'the postings of tenant % are not on this node', tenant
            USING HINT = 'a search names its tenant on every table, so that it runs on the '
                         'worker that holds the tenant';
    END IF;
    RETURN QUERY SELECT t.seq, t.score
                 FROM public.ragservice_bm25_topk_in(postings, totals, collections, terms,
                                                     weights, k, k1, b) AS t;
END $body$"""


def define_tenant_bm25(conn: psycopg.Connection[Any], plan: DistributionPlan) -> bool:
    """Define `ragservice_bm25_topk_tenant` where the extension has the function over given
    tables (version 1.2 or later), for the store's own tables in `public`: whether it did."""
    if plan.schema != "public":
        return False
    row = conn.execute("SELECT to_regprocedure(%s) IS NOT NULL", (_BM25_ON_TABLES,)).fetchone()
    if row is None or not row[0]:
        return False
    conn.execute(_TENANT_BM25)
    return True


# --- the analysts' views ------------------------------------------------------------------------
#
# On one server an analyst reads the views in `analytics` with the views' owner's rights. Citus
# runs a distributed table's part of a query on the workers as the current user, and an
# analyst has no right on the shards ("permission denied for table query_log_102086"). On
# Citus each view reads its rows from a SECURITY DEFINER function of the same query, owned by
# the tables' owner: the workers see the owner, and the analyst's binding is looked up for the
# session's login (inside the function the current user is the owner). The views keep their
# names, columns and `security_barrier`; the analysts' group may read them and run the
# functions, nobody else. (Citus recreates a view whose table it converts without its grants,
# so they are given again.)

ANALYTICS_SCHEMA = "analytics"
ANALYST_GROUP = "ragservice_analyst"
ROWS_SUFFIX = "_rows"
_VIEWS = """
SELECT c.oid, c.relname, pg_get_viewdef(c.oid) FROM pg_class c
WHERE c.relnamespace = %s::regnamespace AND c.relkind = 'v' ORDER BY c.relname"""
_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum"""
_OWN_FUNCTION = re.compile(r"\bFROM\s+analytics\.\w+_rows\(\)", re.IGNORECASE)


LOGIN_VARIABLE = "ragservice_login"


def rows_function_body(definition: str) -> str:
    """A view's query as its SECURITY DEFINER function runs it (PL/pgSQL): the analyst is the
    session's login (inside the function the current user is the owner), read once on the
    coordinator and passed to the workers as a value (`session_user` in the query itself would
    be evaluated on the workers, where the session is the owner's)."""
    query = re.sub(r"\bCURRENT_USER\b", LOGIN_VARIABLE, definition, flags=re.IGNORECASE)
    return (
        "#variable_conflict use_column\n"
        f"DECLARE\n    {LOGIN_VARIABLE} name := session_user;\n"
        f"BEGIN\n    RETURN QUERY {query.rstrip().rstrip(';')};\nEND"
    )


def wrap_analytics_views(conn: psycopg.Connection[Any]) -> list[str]:
    """Give each view of `analytics` its Citus form (above); the views changed. Views already
    reading their function are left as they are."""
    if conn.execute("SELECT to_regnamespace(%s)", (ANALYTICS_SCHEMA,)).fetchone() == (None,):
        return []
    analysts = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ANALYST_GROUP,))
    has_analysts = analysts.fetchone() is not None
    changed = []
    for oid, name, definition in conn.execute(_VIEWS, (ANALYTICS_SCHEMA,)).fetchall():
        view = sql.Identifier(ANALYTICS_SCHEMA, name)
        rows = sql.Identifier(ANALYTICS_SCHEMA, name + ROWS_SUFFIX)
        if not _OWN_FUNCTION.search(definition):
            columns = sql.SQL(", ").join(
                sql.SQL("{} {}").format(sql.Identifier(column), sql.SQL(kind))
                for column, kind in conn.execute(_COLUMNS, (oid,)).fetchall()
            )
            conn.execute(
                sql.SQL(
                    "CREATE OR REPLACE FUNCTION {}() RETURNS TABLE ({}) LANGUAGE plpgsql STABLE "
                    "SECURITY DEFINER SET search_path = pg_catalog, public AS {}"
                ).format(rows, columns, sql.Literal(rows_function_body(definition)))
            )
            conn.execute(
                sql.SQL(
                    "CREATE OR REPLACE VIEW {} WITH (security_barrier = true) AS SELECT * FROM {}()"
                ).format(view, rows)
            )
            changed.append(name)
        conn.execute(sql.SQL("REVOKE ALL ON FUNCTION {}() FROM PUBLIC").format(rows))
        if has_analysts:
            group = sql.Identifier(ANALYST_GROUP)
            conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(view, group))
            conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {}() TO {}").format(rows, group))
    return changed
