"""The Citus cluster and `ragservice db distribute`, on a real coordinator and two workers.

The conversion is checked on small schemas of the tests' own (one per test), so that what
Citus refuses or runs wrongly is shown on the cluster itself, beside what `blockers()` reports
for it; the store's own schema is checked as it stands."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool
from typer.testing import CliRunner

from ragservice.cli import app
from ragservice.config import get_settings
from ragservice.db import distribution, tenancy
from ragservice.db.distribution import BlockerKind, DistributionPlan
from ragservice.db.engine import SERVICE_LOGIN
from ragservice.dev.citus import LOOPBACK, CitusCluster, free_port

TOY_PLAN = dict(reference=("owners",), distributed=("notes", "marks"), coordinator=())


@pytest.fixture
def toy(citus_cluster: CitusCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A schema of the test's own in the coordinator's database: owners (reference), notes and
    marks (by tenant, marks referencing notes); its name."""
    schema = f"toy_{request.node.name.split('[')[0][-40:]}".lower()
    with citus_cluster.coordinator_connection() as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.owners (id uuid PRIMARY KEY)")
        conn.execute(
            f"CREATE TABLE {schema}.notes (tenant_id uuid NOT NULL REFERENCES {schema}.owners, "
            "id int, body text, PRIMARY KEY (id, tenant_id))"
        )
        conn.execute(
            f"CREATE TABLE {schema}.marks (tenant_id uuid NOT NULL, note_id int, "
            f"FOREIGN KEY (note_id, tenant_id) REFERENCES {schema}.notes ON DELETE CASCADE)"
        )
    yield schema
    with citus_cluster.coordinator_connection() as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _plan(schema: str, **changes: Any) -> DistributionPlan:
    return DistributionPlan(**{**TOY_PLAN, **changes}, schema=schema)  # type: ignore[arg-type]


def _seed(conn: psycopg.Connection[Any], schema: str, tenants: int = 4) -> list[uuid.UUID]:
    ids = [uuid.uuid4() for _ in range(tenants)]
    conn.execute(f"INSERT INTO {schema}.owners SELECT unnest(%s::uuid[])", (ids,))
    conn.execute(
        f"INSERT INTO {schema}.notes SELECT t, g, 'note ' || g "
        "FROM unnest(%s::uuid[]) AS t, generate_series(1, 25) AS g",
        (ids,),
    )
    return ids


def test_the_cluster_has_two_workers_with_pgvector(citus_cluster: CitusCluster) -> None:
    with citus_cluster.coordinator_connection() as conn:
        workers = conn.execute(
            "SELECT node_name, node_port FROM citus_get_active_worker_nodes() ORDER BY 2"
        ).fetchall()
        vectors = conn.execute(
            "SELECT result FROM run_command_on_workers("
            "$$SELECT extversion FROM pg_extension WHERE extname = 'vector'$$)"
        ).fetchall()
    assert sorted(workers) == sorted((LOOPBACK, w.port) for w in citus_cluster.workers)
    assert len(vectors) == 2 and all(v[0] for v in vectors)


def test_a_plan_is_carried_out_once_and_a_tenants_query_is_one_task_on_one_worker(
    citus_cluster: CitusCluster, toy: str
) -> None:
    plan = _plan(toy)
    seen: list[tuple[str, int, int]] = []
    with citus_cluster.coordinator_connection() as conn:
        ids = _seed(conn, toy)
        assert distribution.blockers(conn, plan) == []
        report = distribution.distribute(
            conn, plan, progress=lambda step, n, total: seen.append((step.table, n, total))
        )
        again = distribution.distribute(conn, plan)
        kinds = distribution.converted_tables(conn, plan)
        plan_lines = [
            row[0]
            for row in conn.execute(
                f"EXPLAIN SELECT body FROM {toy}.notes WHERE tenant_id = %s ORDER BY id", (ids[1],)
            ).fetchall()
        ]
        count = conn.execute(f"SELECT count(*) FROM {toy}.notes").fetchone()
        keys = conn.execute(
            "SELECT count(*) FROM pg_constraint WHERE contype = 'f' "
            "AND connamespace = %s::regnamespace",
            (toy,),
        ).fetchone()
    assert report.converted == ["owners", "notes", "marks"]
    assert seen == [("owners", 1, 3), ("notes", 2, 3), ("marks", 3, 3)]
    assert again.converted == [] and all(step.done_before for step in again.steps)
    assert kinds == {"owners": "n", "notes": "h", "marks": "h"}
    assert count == (100,)
    assert keys == (2,)  # both foreign keys made again
    text = "\n".join(plan_lines)
    assert "Task Count: 1" in text, text
    worker_ports = {w.port for w in citus_cluster.workers}
    assert any(f"port={port}" in text for port in worker_ports), text


def test_an_interrupted_distribution_leaves_the_schema_as_it_was(
    citus_cluster: CitusCluster, toy: str
) -> None:
    def crash(step: distribution.Step, number: int, _total: int) -> None:
        if number == 2:
            raise RuntimeError("the operator's session was cut")

    with citus_cluster.coordinator_connection() as conn:
        _seed(conn, toy)
        with pytest.raises(RuntimeError, match="cut"):
            distribution.distribute(conn, _plan(toy), progress=crash)
        converted = distribution.converted_tables(conn, _plan(toy))
        keys = conn.execute(
            "SELECT count(*) FROM pg_constraint WHERE contype = 'f' "
            "AND connamespace = %s::regnamespace",
            (toy,),
        ).fetchone()
        report = distribution.distribute(conn, _plan(toy))
    assert converted == {}
    assert keys == (2,)
    assert report.converted == ["owners", "notes", "marks"]


def test_what_blockers_reports_is_what_citus_refuses(citus_cluster: CitusCluster, toy: str) -> None:
    """Each rule, broken on purpose: `blockers()` names it, `distribute` changes nothing, and
    Citus itself refuses it (or, for a trigger, runs it wrongly) when the rule is ignored."""
    distributed = ("notes", "marks", "secrets", "tags")
    with citus_cluster.coordinator_connection() as conn:
        conn.execute(
            f"CREATE TABLE {toy}.secrets (tenant_id uuid NOT NULL, id int, "
            "PRIMARY KEY (id, tenant_id))"
        )
        conn.execute(f"ALTER TABLE {toy}.secrets ENABLE ROW LEVEL SECURITY")
        conn.execute(
            f"CREATE POLICY by_owner ON {toy}.secrets USING "
            f"(tenant_id IN (SELECT id FROM {toy}.owners))"
        )
        conn.execute(f"CREATE TABLE {toy}.tags (tenant_id uuid, name text UNIQUE)")
        conn.execute(f"CREATE TABLE {toy}.loose (name text)")
        found = distribution.blockers(conn, _plan(toy, distributed=distributed))
        with pytest.raises(distribution.DistributionBlockedError) as refused:
            distribution.distribute(conn, _plan(toy, distributed=distributed))
        untouched = distribution.converted_tables(conn, _plan(toy, distributed=distributed))
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="Subqueries are not"):
            conn.execute(f"SELECT create_distributed_table('{toy}.secrets', 'tenant_id')")
        with pytest.raises(psycopg.Error, match="do not include the partition column"):
            conn.execute(f"SELECT create_distributed_table('{toy}.tags', 'tenant_id')")
    described = {(b.table, b.kind) for b in found}
    assert ("secrets", BlockerKind.POLICY_SUBQUERY) in described
    assert ("tags", BlockerKind.UNIQUE_WITHOUT_COLUMN) in described
    assert ("loose", BlockerKind.UNPLANNED_TABLE) in described
    assert len(found) == 3, found
    assert len(refused.value.blockers) == len(found)
    assert "nothing was changed" in str(refused.value)
    assert untouched == {}


def test_a_trigger_reading_its_new_rows_is_a_blocker_and_fails_on_a_shard(
    citus_cluster: CitusCluster, toy: str
) -> None:
    with citus_cluster.coordinator_connection() as conn:
        conn.execute(
            f"CREATE TABLE {toy}.counts (tenant_id uuid NOT NULL, n bigint, PRIMARY KEY "
            "(tenant_id))"
        )
        conn.execute(
            f"CREATE FUNCTION {toy}.count_notes() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"INSERT INTO {toy}.counts AS c SELECT tenant_id, count(*) FROM fresh "
            "GROUP BY tenant_id ON CONFLICT (tenant_id) DO UPDATE SET n = c.n + EXCLUDED.n; "
            "RETURN NULL; END $$"
        )
        conn.execute(
            f"CREATE TRIGGER count_notes AFTER INSERT ON {toy}.notes REFERENCING NEW TABLE "
            f"AS fresh FOR EACH STATEMENT EXECUTE FUNCTION {toy}.count_notes()"
        )
        conn.execute(f"DROP TABLE {toy}.marks")
        plan = _plan(toy, distributed=("notes", "counts"))
        found = distribution.blockers(conn, plan)
        # Ignoring the rule: Citus copies the trigger to the shards, where it fails.
        conn.execute("SET citus.enable_unsafe_triggers = on")
        conn.execute(f"SELECT create_reference_table('{toy}.owners')")
        conn.execute(f"SELECT create_distributed_table('{toy}.notes', 'tenant_id')")
        conn.execute(
            f"SELECT create_distributed_table('{toy}.counts', 'tenant_id', "
            f"colocate_with => '{toy}.notes')"
        )
        conn.execute(f"INSERT INTO {toy}.owners VALUES (%s)", (uuid.UUID(int=7),))
        with pytest.raises(psycopg.Error, match="tuplestore"):
            conn.execute(f"INSERT INTO {toy}.notes VALUES (%s, 1, 'x')", (uuid.UUID(int=7),))
    assert [(b.table, b.kind, b.name) for b in found] == [
        ("notes", BlockerKind.TRANSITION_TABLE_TRIGGER, "count_notes")
    ]


def test_the_transactions_tenant_reaches_the_workers_through_set_local(
    citus_cluster: CitusCluster, toy: str
) -> None:
    """The policies on the workers read the transaction's `ragservice.tenant_id`: Citus sends
    a SET LOCAL on (citus.propagate_set_commands = 'local'), not a set_config() call. The
    service sets it with SET LOCAL (`tenancy.apply`); set_config() would show nothing."""
    with citus_cluster.coordinator_connection() as conn:
        ids = _seed(conn, toy)
        distribution.distribute(conn, _plan(toy))
        conn.execute(f"ALTER TABLE {toy}.notes ENABLE ROW LEVEL SECURITY")
        conn.execute(
            f"CREATE POLICY mine ON {toy}.notes USING "
            "(tenant_id = nullif(current_setting('ragservice.tenant_id', true), '')::uuid)"
        )
        conn.execute(f"GRANT USAGE ON SCHEMA {toy} TO {SERVICE_LOGIN}")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA {toy} TO {SERVICE_LOGIN}")
    engine = create_engine(citus_cluster.service_url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            tenancy.apply(connection, tenancy.Tenancy(tenant_id=ids[2]), switch_role=False)
            by_tenancy = connection.exec_driver_sql(f"SELECT count(*) FROM {toy}.notes").scalar()
            other = connection.exec_driver_sql(
                f"SELECT count(*) FROM {toy}.notes WHERE tenant_id = %(t)s", {"t": ids[0]}
            ).scalar()
            connection.rollback()
            connection.exec_driver_sql(
                "SELECT set_config('ragservice.tenant_id', %(t)s, true)", {"t": str(ids[2])}
            )
            by_function = connection.exec_driver_sql(f"SELECT count(*) FROM {toy}.notes").scalar()
            connection.rollback()
    finally:
        engine.dispose()
    assert by_tenancy == 25  # the tenant's notes only, gathered from both workers
    assert other == 0
    assert by_function == 0  # fails closed: the workers saw no tenant


@pytest.fixture
def cluster_cli(
    citus_cluster: CitusCluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[CliRunner]:
    monkeypatch.setenv("RAGSERVICE_DATABASE_URL", citus_cluster.service_url)
    monkeypatch.setenv("RAGSERVICE_OWNER_DATABASE_URL", citus_cluster.url)
    monkeypatch.setenv("COLUMNS", "200")
    get_settings.cache_clear()
    yield CliRunner()
    get_settings.cache_clear()


def test_db_distribute_spreads_the_store_once_with_progress(
    citus_cluster: CitusCluster, cluster_cli: CliRunner
) -> None:
    checked = cluster_cli.invoke(app, ["db", "distribute", "--check", "--json"])
    first = cluster_cli.invoke(app, ["db", "distribute"])
    again = cluster_cli.invoke(app, ["db", "distribute", "--json"])
    with citus_cluster.coordinator_connection() as conn:
        converted = distribution.converted_tables(conn, distribution.STORE_PLAN)
        logins = conn.execute(
            "SELECT result FROM run_command_on_workers($$SELECT string_agg(rolname, ',' "
            "ORDER BY rolname) FROM pg_roles WHERE rolname LIKE 'ragservice_s%' "
            "AND rolcanlogin$$)"
        ).fetchall()
    report = json.loads(checked.stdout)
    plan = distribution.STORE_PLAN
    assert checked.exit_code == 0, checked.output
    assert report["citus"] and report["blockers"] == [] and report["steps"] == []
    assert first.exit_code == 0, first.output
    total = len(plan.reference) + len(plan.distributed)
    assert f"[1/{total}] tenants: now reference" in first.output
    assert f"[{total}/{total}] prompt_cache_sources: now distributed" in first.output
    assert again.exit_code == 0, again.output
    assert all(step["done_before"] for step in json.loads(again.stdout)["steps"])
    assert {t: converted[t] for t in plan.distributed} == {t: "h" for t in plan.distributed}
    assert {t: converted[t] for t in plan.reference} == {t: "n" for t in plan.reference}
    assert all(converted.get(t) != "h" for t in plan.coordinator)  # the queue stays there
    assert logins == [("ragservice_service,ragservice_system",)] * 2


def test_dev_cluster_citus_serves_until_ctrl_c(citus_available: None) -> None:
    first = free_port()
    data = Path(tempfile.mkdtemp(prefix="rs-citus-"))  # short: Unix socket paths
    env = {**os.environ, "RAGSERVICE_DATA_DIR": str(data), "COLUMNS": "200"}
    env.pop("RAGSERVICE_DATABASE_URL", None)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ragservice",
            "dev-cluster",
            "--citus",
            "--workers",
            "1",
            "--first-port",
            str(first),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip())
            if line.startswith("RAGSERVICE_OWNER_DATABASE_URL="):
                break
        settings = dict(line.split("=", 1) for line in lines if line.startswith("RAGSERVICE_"))
        owner = settings["RAGSERVICE_OWNER_DATABASE_URL"].replace(
            "postgresql+psycopg", "postgresql"
        )
        with psycopg.connect(owner) as conn:
            workers = conn.execute(
                "SELECT count(*) FROM citus_get_active_worker_nodes()"
            ).fetchone()
            revision = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        process.send_signal(signal.SIGINT)
        rest, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        CitusCluster(data, workers=1, first_port=first).destroy()
        shutil.rmtree(data, ignore_errors=True)
    assert workers == (1,), lines
    assert revision is not None
    assert f"{SERVICE_LOGIN}@" in settings["RAGSERVICE_DATABASE_URL"]
    assert process.returncode == 0, rest
    assert "citus nodes stopped" in rest


def test_distribute_rewrites_a_trigger_to_write_its_colocated_shard(
    citus_cluster: CitusCluster, toy: str
) -> None:
    """The same trigger as above, converted by `distribute`: on each shard it writes the shard
    of `counts` that holds the same tenants, also for rows of several tenants at once."""
    with citus_cluster.coordinator_connection() as conn:
        conn.execute(
            f"CREATE TABLE {toy}.counts (tenant_id uuid NOT NULL, n bigint, PRIMARY KEY "
            "(tenant_id))"
        )
        conn.execute(
            f"CREATE FUNCTION {toy}.count_notes() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"INSERT INTO counts AS c SELECT tenant_id, count(*) FROM fresh "
            "GROUP BY tenant_id ON CONFLICT (tenant_id) DO UPDATE SET n = c.n + EXCLUDED.n; "
            f"RETURN NULL; END $$ SET search_path = {toy}"
        )
        conn.execute(
            f"CREATE TRIGGER count_notes AFTER INSERT ON {toy}.notes REFERENCING NEW TABLE "
            f"AS fresh FOR EACH STATEMENT EXECUTE FUNCTION {toy}.count_notes()"
        )
        plan = _plan(toy, distributed=("notes", "marks", "counts"))
        before = distribution.check(conn, plan)
        ids = _seed(conn, toy, tenants=6)  # counted by the trigger on the plain table
        distribution.distribute(conn, plan)
        conn.execute(
            f"INSERT INTO {toy}.notes SELECT t, 100 + g, 'more' "
            "FROM unnest(%s::uuid[]) AS t, generate_series(1, 3) AS g",
            (ids,),
        )
        counts = dict(conn.execute(f"SELECT tenant_id, n FROM {toy}.counts").fetchall())
        kinds = distribution.converted_tables(conn, plan)
    assert before == []
    assert kinds["counts"] == "h"
    assert counts == {tenant: 28 for tenant in ids}


def test_restrictive_policies_are_folded_so_the_shards_narrow_as_the_coordinator_would(
    citus_cluster: CitusCluster, toy: str
) -> None:
    """Citus gives the shards a restrictive policy as a permissive one (shown here on a
    table converted by hand), which would show rows the policy hides; `distribute` folds it
    into the permissive policy instead."""
    policies = (
        "ALTER TABLE {t} ENABLE ROW LEVEL SECURITY;"
        "CREATE POLICY mine ON {t} USING "
        "(tenant_id = nullif(current_setting('ragservice.tenant_id', true), '')::uuid);"
        "CREATE POLICY public_only ON {t} AS RESTRICTIVE USING (body NOT LIKE 'secret%') "
        "WITH CHECK (true);"
        f"GRANT USAGE ON SCHEMA {toy} TO {SERVICE_LOGIN};"
        "GRANT SELECT, INSERT ON {t} TO " + SERVICE_LOGIN
    )
    with citus_cluster.coordinator_connection() as conn:
        ids = _seed(conn, toy, tenants=2)
        conn.execute(f"CREATE TABLE {toy}.by_hand (tenant_id uuid NOT NULL, body text)")
        conn.execute(
            f"INSERT INTO {toy}.by_hand SELECT t, b FROM unnest(%s::uuid[]) AS t, "
            "unnest(ARRAY['open', 'secret']) AS b",
            (ids,),
        )
        conn.execute(policies.format(t=f"{toy}.notes"))
        conn.execute(f"UPDATE {toy}.notes SET body = 'secret' WHERE id <= 5")
        plan = _plan(toy, coordinator=("by_hand",))  # left to be converted by hand below
        found = distribution.blockers(conn, plan)
        distribution.distribute(conn, plan)
        # by_hand's policies come after `distribute` (which folds those of every planned
        # table), then Citus converts it as it is.
        conn.execute(policies.format(t=f"{toy}.by_hand"))
        conn.execute(f"SELECT create_distributed_table('{toy}.by_hand', 'tenant_id')")
        shard_kinds = conn.execute(
            "SELECT DISTINCT result FROM run_command_on_placements("
            f"'{toy}.by_hand', $$SELECT string_agg(polname || '=' || polpermissive, ',' "
            "ORDER BY polname) FROM pg_policy WHERE polrelid = '%s'::regclass$$)"
        ).fetchall()
    engine = create_engine(citus_cluster.service_url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            tenancy.apply(connection, tenancy.Tenancy(tenant_id=ids[0]), switch_role=False)
            notes = connection.exec_driver_sql(f"SELECT body FROM {toy}.notes").scalars().all()
            by_hand = connection.exec_driver_sql(f"SELECT body FROM {toy}.by_hand").scalars()
            by_hand_bodies = sorted(by_hand.all())
            connection.rollback()
    finally:
        engine.dispose()
    assert ("notes", BlockerKind.RESTRICTIVE_POLICY, "public_only") in [
        (b.table, b.kind, b.name) for b in found
    ]
    assert shard_kinds == [("mine=true,public_only=true",)]  # Citus's own conversion
    # ... shows what either policy lets through: the tenant's secret row, the other's open one
    assert by_hand_bodies == ["open", "open", "secret"]
    assert len(notes) == 20 and "secret" not in notes  # folded: hidden on the shards too
