"""Row-level security (migration 0007) against a real PostgreSQL: the service's role sees the
rows of the tenant its transaction names, and none when it names none."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

from ingest.pipeline import IngestPipeline
from ragservice import store
from ragservice.config import Settings
from ragservice.db import open_database, tenancy
from ragservice.db.engine import SERVICE_ROLE
from ragservice.db.scope import request_scope
from ragservice.errors import ConfigurationError
from ragservice.retrieval.search import Mode, SearchOptions
from ragservice.runtime import Runtime, require_unprivileged_login
from ragservice.types import LoadedDocument

pytestmark = pytest.mark.default_tenancy

TENANT_TABLES = (
    "tenants",
    "collections",
    "documents",
    "chunks",
    "chunk_embeddings",
    "chunk_postings",
    "collection_text_stats",
    "sources",
    "source_items",
)


@pytest.fixture
def two_tenants(runtime: Runtime) -> dict[str, tuple[uuid.UUID, uuid.UUID]]:
    """Tenants acme and globex, each with a collection `docs` of one document of its own."""
    made = {}
    for name, body in (("acme", "Aspirin lowers fever."), ("globex", "Steel corrodes in water.")):
        with tenancy.as_system(), runtime.db.write() as session:
            tenant_id = store.tenants.ensure_tenant(session, name)
        model = runtime.models.current()
        pipeline = IngestPipeline(
            runtime.db,
            model.embedder,
            model_id=model.id,
            tenant_id=tenant_id,
            chunking=runtime.chunking_options(),
            batch_chunks=64,
        )
        document = LoadedDocument(external_id=f"{name}-1", text=body, title=name, metadata={})
        pipeline.run([document], collection="docs")
        with tenancy.as_tenant(tenant_id), runtime.db.read() as session:
            collection_id = store.collections.find_collection_id(session, tenant_id, "docs")
        assert collection_id is not None
        made[name] = (tenant_id, collection_id)
    return made


def _service_connection(url: str) -> psycopg.Connection[tuple[object, ...]]:
    """A bare connection working as the service role, with no tenancy set at all."""
    libpq = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = psycopg.connect(libpq, autocommit=True)
    conn.execute(psycopg.sql.SQL("SET ROLE {}").format(psycopg.sql.Identifier(SERVICE_ROLE)))
    return conn


def _external_ids(runtime: Runtime) -> list[str]:
    # Deliberately unscoped: no tenant in the WHERE clause.
    with runtime.db.read() as session:
        rows = session.execute(text("SELECT external_id FROM documents ORDER BY 1"))
        return [str(row[0]) for row in rows]


def test_the_service_works_as_a_role_bound_by_row_level_security(runtime: Runtime) -> None:
    assert runtime.db.role == SERVICE_ROLE
    with runtime.db.read() as session:
        user = session.execute(text("SELECT current_user")).scalar_one()
        role = session.execute(
            text("SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user")
        ).one()
        owners = set(
            session.execute(
                text("SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'")
            ).scalars()
        )
        unprotected = (
            session.execute(
                text(
                    "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace "
                    "AND relkind = 'r' AND relname = ANY(:tables) AND NOT relrowsecurity"
                ),
                {"tables": list(TENANT_TABLES)},
            )
            .scalars()
            .all()
        )
    assert user == SERVICE_ROLE
    assert tuple(role) == (False, False)
    assert SERVICE_ROLE not in owners
    assert unprotected == []


def test_a_query_without_a_tenant_sees_no_rows(
    runtime: Runtime, two_tenants: dict[str, tuple[uuid.UUID, uuid.UUID]], database_url: str
) -> None:
    with _service_connection(database_url) as conn:
        for table in TENANT_TABLES:
            count = conn.execute(
                psycopg.sql.SQL("SELECT count(*) FROM {}").format(psycopg.sql.Identifier(table))
            ).fetchone()
            assert count == (0,), table
    # The same in a request before its API key is known.
    with request_scope():
        assert _external_ids(runtime) == []


def test_an_unscoped_query_sees_its_own_tenants_rows_only(
    runtime: Runtime, two_tenants: dict[str, tuple[uuid.UUID, uuid.UUID]]
) -> None:
    acme, _ = two_tenants["acme"]
    globex, _ = two_tenants["globex"]
    with request_scope() as scope:
        scope.tenant_id = acme
        assert _external_ids(runtime) == ["acme-1"]
    with tenancy.as_tenant(globex):
        assert _external_ids(runtime) == ["globex-1"]
    with tenancy.as_system():
        assert _external_ids(runtime) == ["acme-1", "globex-1"]


def test_a_tenant_cannot_write_rows_of_another(
    runtime: Runtime, two_tenants: dict[str, tuple[uuid.UUID, uuid.UUID]]
) -> None:
    acme, _ = two_tenants["acme"]
    globex, globex_docs = two_tenants["globex"]
    refused = pytest.raises(ProgrammingError, match="row-level security")
    with tenancy.as_tenant(acme), refused, runtime.db.write() as session:
        store.collections.create_collection(session, globex, "planted")
    with tenancy.as_tenant(acme), runtime.db.write() as session:
        # Another tenant's rows are invisible to UPDATE and DELETE alike.
        renamed = session.execute(
            text("UPDATE collections SET name = 'stolen' WHERE id = :id"), {"id": globex_docs}
        )
        deleted = session.execute(text("DELETE FROM documents WHERE tenant_id = :t"), {"t": globex})
    assert (renamed.rowcount, deleted.rowcount) == (0, 0)  # type: ignore[attr-defined]
    with tenancy.as_tenant(globex):
        assert _external_ids(runtime) == ["globex-1"]


def test_search_over_foreign_collection_ids_finds_nothing(
    runtime: Runtime, two_tenants: dict[str, tuple[uuid.UUID, uuid.UUID]]
) -> None:
    """Even a caller that passes another tenant's collection ids: both halves of a hybrid
    search (the full-text one runs on another thread) see the transaction's tenant only."""
    from ragservice.retrieval.search import Searcher

    acme, _ = two_tenants["acme"]
    _, globex_docs = two_tenants["globex"]
    options = SearchOptions.from_settings(runtime.settings.search, k=5)
    with Searcher(runtime.db, models=runtime.models.current) as searcher:
        with tenancy.as_system():
            found = searcher.search(collection_ids=[globex_docs], query="steel", options=options)
        assert [hit.external_id for hit in found.hits] == ["globex-1"]
        for mode in Mode:
            scoped = SearchOptions.from_settings(runtime.settings.search, k=5, mode=mode)
            with tenancy.as_tenant(acme):
                hits = searcher.search(collection_ids=[globex_docs], query="steel", options=scoped)
            assert hits.hits == [], mode


@pytest.fixture
def user_without_the_service_role(database_url: str) -> Iterator[str]:
    """A login that may connect but is not a member of ragservice_service."""
    name = f"plain_{uuid.uuid4().hex[:8]}"
    libpq = (
        make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
    )
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN").format(psycopg.sql.Identifier(name)))
    yield (
        make_url(database_url)
        .set(username=name, password=None)
        .render_as_string(hide_password=False)
    )
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("DROP ROLE {}").format(psycopg.sql.Identifier(name)))


def test_without_the_service_role_the_service_refuses_to_start_unless_told(
    user_without_the_service_role: str, tmp_path: Path
) -> None:
    settings = Settings(database_url=user_without_the_service_role, data_dir=tmp_path)
    with pytest.raises(ConfigurationError, match="RAGSERVICE_ALLOW_NO_ROW_SECURITY=1"):
        open_database(settings, run_migrations=False)

    allowed = settings.model_copy(update={"allow_no_row_security": True})
    db = open_database(allowed, run_migrations=False)
    try:
        assert db.role is None
    finally:
        db.dispose()


def test_definer_functions_are_not_fooled_by_temporary_tables(runtime: Runtime) -> None:
    """A temporary `chunk_embeddings` of the service's session does not shadow the real table
    inside the SECURITY DEFINER index functions (their search path ends with pg_temp)."""
    with _service_connection(runtime.db.url) as conn:
        conn.execute("CREATE TEMP TABLE chunk_embeddings (embedding vector, model_id integer)")
        name = conn.execute("SELECT ragservice_ensure_embedding_index(999, 3, 16, 64)").fetchone()
        assert name == ("chunk_embeddings_hnsw_model_999",)
        where = conn.execute(
            "SELECT schemaname, tablename FROM pg_indexes WHERE indexname = %s", name
        ).fetchall()
        assert where == [("public", "chunk_embeddings")]
        conn.execute("SELECT ragservice_drop_embedding_index(999)")
        settings = conn.execute(
            "SELECT DISTINCT proconfig FROM pg_proc WHERE proname IN ("
            "'ragservice_ensure_embedding_index', 'ragservice_ensure_cache_index', "
            "'ragservice_drop_embedding_index')"
        ).fetchall()
        assert settings == [(["search_path=pg_catalog, public, pg_temp"],)]


def test_outside_any_scope_the_service_sees_no_tenant(
    runtime: Runtime, two_tenants: dict[str, tuple[uuid.UUID, uuid.UUID]]
) -> None:
    """Code that forgets to say whose rows it works on (no request, no `as_*`) sees none;
    cross-tenant work says so with `as_system()`."""
    assert tenancy.current() == tenancy.NO_TENANT
    assert _external_ids(runtime) == []
    with tenancy.as_system():
        assert _external_ids(runtime) == ["acme-1", "globex-1"]


def test_no_setting_lifts_the_policies(
    runtime: Runtime, two_tenants: dict[str, tuple[uuid.UUID, uuid.UUID]]
) -> None:
    """ "All tenants" is the role `ragservice_system`, not a setting a session may change."""
    acme, _ = two_tenants["acme"]
    with tenancy.as_tenant(acme), runtime.db.read() as session:
        session.execute(text("SELECT set_config('ragservice.system', 'on', true)"))
        seen = session.execute(text("SELECT external_id FROM documents")).scalars().all()
    assert seen == ["acme-1"]


def test_the_service_login_cannot_reset_its_way_out(
    runtime: Runtime, two_tenants: dict[str, tuple[uuid.UUID, uuid.UUID]]
) -> None:
    """The service logs in as a plain role: RESET ROLE leaves it bound by the policies."""
    assert runtime.db.privileged_login is None
    with runtime.db.read() as session:
        session.execute(text("RESET ROLE"))
        who = session.execute(text("SELECT current_user, session_user")).one()
        seen = session.execute(text("SELECT count(*) FROM documents")).scalar_one()
    assert tuple(who) == ("ragservice_app", "ragservice_app")
    assert seen == 0


def test_a_privileged_login_is_refused_for_serving_unless_told(
    database_url: str, tmp_path: Path
) -> None:
    settings = Settings(database_url=database_url, data_dir=tmp_path)  # the test superuser
    db = open_database(settings, run_migrations=False)
    try:
        assert db.privileged_login == "a superuser"
        with pytest.raises(ConfigurationError, match="login is a superuser"):
            require_unprivileged_login(db, settings.security)
        allowed = settings.model_copy(update={"allow_no_row_security": True})
        require_unprivileged_login(db, allowed.security)  # a warning only
    finally:
        db.dispose()


def test_the_service_login_alone_serves_a_current_schema_and_cannot_migrate(
    service_url: str, database_url: str, tmp_path: Path
) -> None:
    """As in docker-compose: the owner migrates, the service starts with its own login only."""
    settings = Settings(database_url=service_url, data_dir=tmp_path)
    db = open_database(settings, route_reads=False)  # at head: nothing to migrate
    try:
        assert (db.role, db.privileged_login) == (SERVICE_ROLE, None)
    finally:
        db.dispose()
    owner = make_url(database_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(owner, autocommit=True) as conn:
        head = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        conn.execute("UPDATE alembic_version SET version_num = '0012'")
    try:
        with pytest.raises(ConfigurationError, match="run `ragservice db upgrade` with the owner"):
            open_database(settings, route_reads=False)
    finally:
        with psycopg.connect(owner, autocommit=True) as conn:
            conn.execute("UPDATE alembic_version SET version_num = %s", head)
