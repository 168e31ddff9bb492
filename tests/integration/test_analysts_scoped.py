"""Analysts bound to a tenant (migration 0008) against a real PostgreSQL, as the analyst over
psycopg: no temporary objects, a statement timeout, barrier views that a leaky WHERE clause
cannot look behind, one tenant's rows (or every tenant's, or none), the CLI, the migration
itself, and a database whose owner is no superuser (row-level security does not bind it)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from ragservice import store
from ragservice.config import Settings
from ragservice.db import Database, migrate, open_database
from ragservice.types import TextChunk
from tests.integration.test_analytics import VIEWS, Seeded, new_analyst, seed

Conn = psycopg.Connection[dict[str, Any]]


@pytest.fixture
def tenants(settings: Settings) -> Iterator[tuple[Seeded, Seeded]]:
    """acme and globex, each with rows in every view; globex's questions, answers, comments
    and corrections start with "globex"."""
    db = open_database(settings, route_reads=False)
    try:
        yield seed(db, "acme"), seed(db, "globex")
    finally:
        db.dispose()


@contextmanager
def connect(database_url: str, user: str, password: str) -> Iterator[Conn]:
    base = make_url(database_url).set(drivername="postgresql", username=None, password=None)
    with psycopg.connect(
        base.render_as_string(), user=user, password=password, autocommit=True, row_factory=dict_row
    ) as conn:
        yield conn


@contextmanager
def admin(database_url: str) -> Iterator[Conn]:
    """The test's connecting user (the database's owner), on the test's database."""
    url = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        yield conn


def view_rows(conn: Conn, view: str) -> list[dict[str, Any]]:
    return conn.execute(
        sql.SQL("SELECT * FROM analytics.{}").format(sql.Identifier(view))
    ).fetchall()


def _downgrade(engine: Engine, revision: str) -> None:
    from alembic import command

    config = migrate.alembic_config()
    with engine.connect() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, revision)
        conn.commit()


def _write_document(db: Database, seeded: Seeded, external_id: str) -> None:
    with db.write() as session:
        model = store.embedding_models.ensure_model(
            session, name="fake", dimension=4, path=None, hnsw_m=8, hnsw_ef_construction=16
        )
        store.documents.write_documents(
            session,
            tenant_id=seeded.tenant,
            collection_id=seeded.collection,
            model_id=model.id,
            documents=[
                store.documents.DocumentWrite(
                    external_id=external_id,
                    title=external_id,
                    source="test",
                    metadata={},
                    content_hash=external_id,
                    char_count=5,
                    chunks=[TextChunk(0, "hello", 0, 5, 1)],
                    chunk_hashes=[external_id],
                    embeddings=np.ones((1, 4), dtype=np.float32),
                )
            ],
        )


def test_an_analyst_creates_no_temporary_objects_and_the_service_still_bulk_loads(
    tenants: tuple[Seeded, Seeded], settings: Settings, database_url: str
) -> None:
    acme, _ = tenants
    with new_analyst(acme.db, acme.tenant) as analyst, connect(database_url, *analyst) as conn:
        for statement in (
            "CREATE TEMP TABLE notes (body text)",
            "CREATE TEMPORARY VIEW one AS SELECT 1",
            "CREATE FUNCTION pg_temp.peek(text) RETURNS boolean LANGUAGE sql AS 'SELECT true'",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="temporary"):
                conn.execute(statement)
    # Bulk writes stage COPY in a temporary table as the service role, on fresh connections
    # (a connection keeps the temporary schema it made before the privilege went).
    db = open_database(settings, route_reads=False)
    try:
        with db.read() as session:
            granted = session.execute(
                text(
                    "SELECT current_user, "
                    "has_database_privilege(current_user, current_database(), 'TEMPORARY'), "
                    "has_database_privilege('public', current_database(), 'TEMPORARY')"
                )
            ).one()
        # this test's thread works across tenants: as the system role, a service role too
        assert tuple(granted) == ("ragservice_system", True, False)
        _write_document(db, acme, "after-restriction")
        with db.read() as session:
            stored = session.execute(
                text("SELECT count(*) FROM documents WHERE external_id = 'after-restriction'")
            ).scalar_one()
        assert stored == 1
    finally:
        db.dispose()


def test_an_analysts_statements_time_out(tenants: tuple[Seeded, Seeded], database_url: str) -> None:
    acme, _ = tenants
    with (
        new_analyst(acme.db, acme.tenant, timeout_seconds=1) as analyst,
        connect(database_url, *analyst) as conn,
    ):
        assert conn.execute("SHOW statement_timeout").fetchone() == {"statement_timeout": "1s"}
        assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone() == {
            "idle_in_transaction_session_timeout": "1s"
        }
        with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
            conn.execute("SELECT pg_sleep(3)")
        assert view_rows(conn, "corpus")  # the session goes on


def test_a_tenant_bound_analyst_sees_its_tenants_rows_only(
    tenants: tuple[Seeded, Seeded], database_url: str
) -> None:
    acme, globex = tenants
    db = acme.db
    with (
        new_analyst(db, acme.tenant) as bound,
        new_analyst(db, None) as everyone,
        new_analyst(db, globex.tenant) as unbound,
        connect(database_url, *bound) as as_bound,
        connect(database_url, *everyone) as as_everyone,
        connect(database_url, *unbound) as as_unbound,
    ):
        with admin(database_url) as owner:
            owner.execute("DELETE FROM analyst_tenants WHERE role_name = %s", (unbound[0],))
        for view in VIEWS:
            seen, every = view_rows(as_bound, view), view_rows(as_everyone, view)
            assert seen, view
            assert {row["tenant"] for row in seen} == {"acme"}, view
            assert {row["tenant"] for row in every} == {"acme", "globex"}, view
            acme_rows = [row for row in every if row["tenant"] == "acme"]
            assert sorted(map(repr, seen)) == sorted(map(repr, acme_rows)), view
            assert view_rows(as_unbound, view) == [], view  # no binding: nothing (fail closed)
        # The analyst's own filters cannot widen it either.
        wide = as_bound.execute(
            "SELECT count(*) AS n FROM analytics.negative_feedback WHERE tenant = 'globex' "
            "OR tenant_id = %s OR true",
            (globex.tenant,),
        ).fetchone()
        assert wide == {"n": 2}
        # The binding table itself is out of reach.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            as_bound.execute("SELECT * FROM analyst_tenants")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            as_bound.execute("INSERT INTO analyst_tenants VALUES (current_user, NULL)")


def test_a_leaky_where_clause_never_sees_another_tenants_rows(
    tenants: tuple[Seeded, Seeded], database_url: str
) -> None:
    """A cheap function that prints its argument, and a cast that fails (printing the value)
    on globex's rows only: run by the planner before the view's own tenant condition unless the
    view is a security barrier. The same queries on the views without the barrier show that
    they would reach globex's rows."""
    acme, _ = tenants
    with admin(database_url) as owner:
        owner.execute("CREATE SCHEMA probe")
        owner.execute(
            "CREATE FUNCTION probe.peek(text) RETURNS boolean LANGUAGE plpgsql COST 0.0000001 "
            "AS $$ BEGIN RAISE NOTICE 'peek: %', $1; RETURN true; END $$"
        )
    leaky = [
        f"SELECT {column} FROM analytics.{view} WHERE probe.peek({column})"
        for view, column in (
            ("negative_feedback", "question"),
            ("negative_feedback", "answer"),
            ("negative_feedback", "comment"),
            ("negative_feedback", "corrected_answer"),
            ("weak_retrieval", "question"),
        )
    ]
    failing_cast = (
        "SELECT question FROM analytics.{} "
        "WHERE CASE WHEN question LIKE 'globex%' THEN question::int = 0 ELSE true END"
    )
    with new_analyst(acme.db, acme.tenant) as analyst, connect(database_url, *analyst) as conn:
        with admin(database_url) as owner:
            owner.execute(
                sql.SQL("GRANT USAGE ON SCHEMA probe TO {}").format(sql.Identifier(analyst[0]))
            )
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))

        def peeked() -> list[str]:
            notices.clear()
            for query in leaky:
                conn.execute(query).fetchall()
            return list(notices)

        try:
            seen = peeked()
            assert any("question good" in notice for notice in seen)  # the function did run
            assert not [notice for notice in seen if "globex" in notice]
            for view in ("negative_feedback", "weak_retrieval"):
                found = conn.execute(failing_cast.format(view)).fetchall()
                assert found and all(not row["question"].startswith("globex") for row in found)

            with admin(database_url) as owner:
                for view in ("negative_feedback", "weak_retrieval"):
                    owner.execute(f"ALTER VIEW analytics.{view} SET (security_barrier = false)")
            assert [notice for notice in peeked() if "globex" in notice]
            with pytest.raises(psycopg.errors.InvalidTextRepresentation, match="globex question"):
                conn.execute(failing_cast.format("weak_retrieval"))
        finally:
            with admin(database_url) as owner:
                owner.execute("DROP SCHEMA probe CASCADE")  # else the role cannot be dropped


def _scram_matches(stored: str, password: str) -> bool:
    """Whether a SCRAM-SHA-256 verifier of pg_authid was made from `password`."""
    method, _, rest = stored.partition("$")
    assert method == "SCRAM-SHA-256"
    iterations_salt, keys = rest.split("$")
    iterations, salt = iterations_salt.split(":")
    stored_key = base64.b64decode(keys.split(":")[0])
    salted = hashlib.pbkdf2_hmac(
        "sha256", password.encode(), base64.b64decode(salt), int(iterations)
    )
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    return hmac.compare_digest(hashlib.sha256(client_key).digest(), stored_key)


def test_the_cli_binds_analysts_and_reads_the_password_from_stdin(
    tenants: tuple[Seeded, Seeded], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from ragservice.cli import app
    from ragservice.config import get_settings

    monkeypatch.setenv("RAGSERVICE_DATABASE_URL", database_url)
    monkeypatch.setenv("RAGSERVICE_ANALYST_STATEMENT_TIMEOUT_SECONDS", "7")
    monkeypatch.delenv("RAGSERVICE_REPLICAS", raising=False)
    get_settings.cache_clear()
    name = f"analyst_{uuid.uuid4().hex[:10]}"
    runner = CliRunner()

    def invoke(*args: str, stdin: str | None = None) -> Any:
        return runner.invoke(app, ["analysts", *args], input=stdin)

    def listed() -> list[str]:
        result = invoke("list")
        assert result.exit_code == 0, result.output
        return [line for line in result.stdout.splitlines() if line.startswith(f"{name}\t")]

    try:
        unknown = invoke("add", name, "--tenant", "nope")
        assert unknown.exit_code == 1
        assert "no tenant named 'nope'" in unknown.stderr
        for scope in ([], ["--tenant", "acme", "--all-tenants"]):
            unscoped = invoke("add", name, *scope)
            assert unscoped.exit_code == 2
            assert "exactly one of --tenant" in unscoped.stderr
        on_the_command_line = invoke("add", name, "--all-tenants", "--password", "pw")
        assert on_the_command_line.exit_code == 2
        assert "No such option" in on_the_command_line.stderr
        empty = invoke("add", name, "--all-tenants", "--password-stdin", stdin="")
        assert empty.exit_code == 1
        assert "held no password" in empty.stderr
        assert listed() == []  # none of these created the role

        added = invoke("add", name, "--tenant", "acme", "--password-stdin", stdin="s3cret pw\n")
        assert added.exit_code == 0, added.output
        url = psycopg.conninfo.conninfo_to_dict(added.stdout.strip())
        assert url["user"] == name and "password" not in url  # not echoed back
        assert "shown only this once" not in added.stderr
        with admin(database_url) as owner:
            verifier = owner.execute(
                "SELECT rolpassword FROM pg_authid WHERE rolname = %s", (name,)
            ).fetchone()
        assert verifier is not None and _scram_matches(verifier["rolpassword"], "s3cret pw")
        assert listed() == [f"{name}\tlogin\tacme\t7s"]

        with connect(database_url, name, "s3cret pw") as conn:
            assert conn.execute("SHOW statement_timeout").fetchone() == {"statement_timeout": "7s"}
            tenants_seen = conn.execute("SELECT DISTINCT tenant FROM analytics.queries_per_day")
            assert tenants_seen.fetchall() == [{"tenant": "acme"}]

        # A database's ACL resets (a restore, a template): list warns, update re-applies.
        with admin(database_url) as owner:
            owner.execute(
                sql.SQL("GRANT TEMPORARY ON DATABASE {} TO PUBLIC").format(
                    sql.Identifier(make_url(database_url).database or "")
                )
            )
        assert "PUBLIC may create temporary tables" in invoke("list").stderr
        monkeypatch.setenv("RAGSERVICE_ANALYST_STATEMENT_TIMEOUT_SECONDS", "9")
        get_settings.cache_clear()
        moved = invoke("update", name, "--all-tenants")
        assert moved.exit_code == 0, moved.output
        assert "PUBLIC may create temporary tables" not in moved.stderr
        assert listed() == [f"{name}\tlogin\tall\t9s"]
        assert "PUBLIC may create" not in invoke("list").stderr
        assert invoke("update", name, "--tenant", "nope").exit_code == 1
        missing = invoke("update", "nobody_here", "--tenant", "acme")
        assert missing.exit_code == 1
        assert "no analyst named 'nobody_here'" in missing.stderr

        removed = invoke("remove", name)
        assert removed.exit_code == 0, removed.output
        assert listed() == []
        with admin(database_url) as owner:
            binding = owner.execute(
                "SELECT count(*) AS n FROM analyst_tenants WHERE role_name = %s", (name,)
            ).fetchone()
        assert binding == {"n": 0}
    finally:
        with tenants[0].db.owner() as session:
            store.analysts.remove_analyst(session, name)
        get_settings.cache_clear()


def _settings_of(database_url: str) -> dict[str, Any]:
    with admin(database_url) as conn:
        found = conn.execute(
            "SELECT "
            "(SELECT array_agg(c.relname::text ORDER BY c.relname) FROM pg_class c "
            " WHERE c.relnamespace = 'analytics'::regnamespace AND c.relkind = 'v' "
            " AND 'security_barrier=true' = ANY(coalesce(c.reloptions, '{}'))) AS barriers, "
            "to_regclass('public.analyst_tenants') IS NOT NULL AS bindings, "
            "has_database_privilege('public', current_database(), 'TEMPORARY') AS public_temp, "
            "EXISTS (SELECT 1 FROM pg_database d, aclexplode(d.datacl) a "
            "        WHERE d.datname = current_database() AND a.privilege_type = 'TEMPORARY' "
            "        AND a.grantee = 'ragservice_service'::regrole) AS service_temp"
        ).fetchone()
    assert found is not None
    return found


def test_migration_0008_keeps_existing_analysts_on_every_tenant_and_downgrades(
    tenants: tuple[Seeded, Seeded], database_url: str
) -> None:
    acme, _ = tenants
    engine = create_engine(database_url)
    old = f"old_analyst_{uuid.uuid4().hex[:8]}"
    try:
        _downgrade(engine, "0007")
        assert _settings_of(database_url) == {
            "barriers": None,
            "bindings": False,
            "public_temp": True,
            "service_temp": False,
        }
        # An analyst made before 0008 (as `analysts add` did then): every tenant, temporary
        # tables, no timeout.
        with admin(database_url) as owner:
            owner.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw' IN ROLE ragservice_analyst").format(
                    sql.Identifier(old)
                )
            )
        with connect(database_url, old, "pw") as conn:
            conn.execute("CREATE TEMP TABLE scratch (x int)")
            assert conn.execute("SHOW statement_timeout").fetchone() == {"statement_timeout": "0"}
            tenants_seen = conn.execute("SELECT DISTINCT tenant FROM analytics.corpus ORDER BY 1")
            assert [row["tenant"] for row in tenants_seen] == ["acme", "globex"]

        migrate.upgrade(engine)
        assert _settings_of(database_url) == {
            "barriers": sorted(VIEWS),
            "bindings": True,
            "public_temp": False,
            "service_temp": True,
        }
        with acme.db.owner() as session:
            (found,) = [a for a in store.analysts.list_analysts(session) if a.name == old]
        assert (found.bound, found.tenant) == (True, None)  # every tenant, as before
        assert found.timeouts == {
            "statement_timeout": "60s",
            "idle_in_transaction_session_timeout": "60s",
        }
        with admin(database_url) as owner:
            privileges = owner.execute(
                "SELECT has_table_privilege('ragservice_service', 'analyst_tenants', 'SELECT') "
                "OR has_table_privilege('ragservice_service', 'analyst_tenants', 'INSERT') AS s, "
                "has_table_privilege('ragservice_analyst', 'analyst_tenants', 'SELECT') AS a"
            ).fetchone()
        assert privileges == {"s": False, "a": False}
        with connect(database_url, old, "pw") as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("CREATE TEMP TABLE scratch (x int)")
            assert conn.execute("SHOW statement_timeout").fetchone() == {
                "statement_timeout": "1min"
            }
            tenants_seen = conn.execute("SELECT DISTINCT tenant FROM analytics.corpus ORDER BY 1")
            assert [row["tenant"] for row in tenants_seen] == ["acme", "globex"]

        _downgrade(engine, "0007")
        assert _settings_of(database_url) == {
            "barriers": None,
            "bindings": False,
            "public_temp": True,
            "service_temp": False,
        }
        migrate.upgrade(engine)
        assert migrate.is_current(engine)
    finally:
        engine.dispose()
        with admin(database_url) as owner:
            owner.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(old)))


@pytest.fixture
def owned_by_a_plain_user(pg_admin_url: str, template_url: str) -> Iterator[str]:
    """A database whose owner, the user that migrates it and runs the service, is no superuser
    (as on managed servers): a URL as that user. It may create roles and administer the three
    server-wide roles the session's template migration made."""
    suffix = uuid.uuid4().hex[:10]
    owner, database, password = f"rs_owner_{suffix}", f"rs_owned_{suffix}", uuid.uuid4().hex
    with admin(pg_admin_url) as conn:
        me = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        if not (me and me["rolsuper"]):
            pytest.skip("the test server's user is no superuser")
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN CREATEROLE PASSWORD {}").format(
                sql.Identifier(owner), sql.Literal(password)
            )
        )
        conn.execute(
            sql.SQL(
                "GRANT ragservice_analyst, ragservice_service, ragservice_system TO {} "
                "WITH ADMIN OPTION"
            ).format(sql.Identifier(owner))
        )
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(database), sql.Identifier(owner)
            )
        )
    url = make_url(pg_admin_url).set(database=database)
    with admin(url.render_as_string(hide_password=False)) as conn:
        conn.execute("CREATE EXTENSION vector")  # not a trusted extension
    try:
        yield url.set(username=owner, password=password).render_as_string(hide_password=False)
    finally:
        with admin(pg_admin_url) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
            )
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(owner)))


def test_the_views_scope_rows_when_the_owner_is_no_superuser(
    owned_by_a_plain_user: str, tmp_path: Any
) -> None:
    """Row-level security (0007) is enabled, not forced: the views' owner, who owns the tables,
    reads every row, so the analyst's binding alone decides what the analyst sees."""
    url = owned_by_a_plain_user
    db = open_database(Settings(database_url=url, data_dir=tmp_path), route_reads=False)
    try:
        with admin(url) as owner:
            facts = owner.execute(
                "SELECT r.rolsuper, r.rolbypassrls, c.relrowsecurity, c.relforcerowsecurity, "
                "has_database_privilege('public', current_database(), 'TEMPORARY') AS temp "
                "FROM pg_roles r, pg_class c "
                "WHERE r.rolname = current_user AND c.oid = 'public.query_log'::regclass"
            ).fetchone()
        assert facts == {
            "rolsuper": False,
            "rolbypassrls": False,
            "relrowsecurity": True,
            "relforcerowsecurity": False,
            "temp": False,  # the migration revoked it: the owner may
        }
        acme, _ = seed(db, "acme"), seed(db, "globex")
        with new_analyst(db, acme.tenant) as analyst, connect(url, *analyst) as conn:
            for view in VIEWS:
                seen = view_rows(conn, view)
                assert seen and {row["tenant"] for row in seen} == {"acme"}, view
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("CREATE TEMP TABLE scratch (x int)")
    finally:
        db.dispose()
