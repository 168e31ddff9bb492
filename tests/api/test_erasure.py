"""What is deleted is gone: a deleted document's text leaves the query log, the exports and the
cache; `ragservice tenants delete` leaves no row naming the tenant or holding its text.

Each test scans every table of the database (each row cast to text, as the owner, whom
row-level security does not bind) for a marker word that only the deleted documents contain.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from psycopg import sql
from sqlalchemy import select
from sqlalchemy.engine import make_url

from ragservice import store
from ragservice.db import tenancy
from ragservice.db.models import QueryLog
from tests.api.conftest import Keys, ok, wait_for_job

MARKER = "xqzvkmarkword"
QUESTION = "How many vacation days do staff get?"
SECRET = f"Staff get thirty vacation days a year, code {MARKER}."
PUBLIC = "Book flights through the travel desk two weeks ahead."


def hits(database_url: str, needle: str) -> dict[str, int]:
    """table → rows whose text holds `needle` (bytea columns show as hex, so its hex too)."""
    url = make_url(database_url).set(drivername="postgresql").render_as_string(False)
    found: dict[str, int] = {}
    with psycopg.connect(url) as conn:
        tables = conn.execute(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_type = 'BASE TABLE' AND table_schema NOT IN "
            "('pg_catalog', 'information_schema')"
        ).fetchall()
        for schema, table in tables:
            count = conn.execute(
                sql.SQL(
                    "SELECT count(*) FROM {} t WHERE strpos(lower(t::text), %s) > 0 "
                    "OR strpos(lower(t::text), %s) > 0"
                ).format(sql.Identifier(schema, table)),
                (needle.lower(), needle.lower().encode().hex()),
            ).fetchone()
            assert count is not None
            if count[0]:
                found[table] = count[0]
    return found


def upload(client: TestClient, headers: dict[str, str], collection: str, docs: list[Any]) -> None:
    ok(client.post("/v1/collections", json={"name": collection}, headers=headers), 201)
    documents = [{"external_id": i, "title": i, "text": x} for i, x in docs]
    body = {"documents": documents}
    path = f"/v1/collections/{collection}/documents"
    job = ok(client.post(path, json=body, headers=headers), 202)
    assert wait_for_job(client, job["id"], headers)["status"] == "done"


def ask(client: TestClient, headers: dict[str, str], collection: str) -> dict[str, Any]:
    body = {"question": QUESTION, "collections": [collection], "k": 2}
    answer: dict[str, Any] = ok(client.post("/v1/query", json=body, headers=headers))
    return answer


def logged(client: TestClient, query_id: str) -> QueryLog:
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.read() as session:
        row = session.scalar(select(QueryLog).where(QueryLog.id == uuid.UUID(query_id)))
    assert row is not None
    return row


@pytest.fixture
def answered(client: TestClient, keys: Keys) -> dict[str, Any]:
    """acme's collection "hr" with the secret and a public document, a question answered from
    both (then again, from the cache), and feedback on the answer."""
    upload(client, keys.writer, "hr", [("secret", SECRET), ("public", PUBLIC)])
    answer = ask(client, keys.reader, "hr")
    assert MARKER in answer["answer"]
    assert ask(client, keys.reader, "hr")["cache"]["hit"] is True
    body = {"query_id": answer["query_id"], "rating": 1, "comment": "useful"}
    ok(client.post("/v1/feedback", json=body, headers=keys.reader), 201)
    return answer


def test_deleting_a_document_removes_its_text_from_log_cache_and_exports(
    client: TestClient, keys: Keys, answered: dict[str, Any], database_url: str
) -> None:
    before = hits(database_url, MARKER)
    # The scan sees the text where it was: chunks, postings, the log, the cache.
    assert {"chunks", "chunk_postings", "query_log", "prompt_cache"} <= set(before)
    export = "/v1/feedback/export?format=openai-sft&min_rating=1"
    assert MARKER in client.get(export, headers=keys.admin).text

    deleted = client.delete("/v1/collections/hr/documents/secret", headers=keys.writer)
    assert deleted.status_code == 204

    assert hits(database_url, MARKER) == {}
    row = logged(client, answered["query_id"])
    assert (row.answer, row.messages) == (None, None)
    assert row.redacted_at is not None
    assert row.question == QUESTION  # the asker's words stay
    assert client.get(export, headers=keys.admin).text == ""
    # The other document and its answers are untouched.
    again = ask(client, keys.reader, "hr")
    assert again["cache"]["hit"] is False
    assert MARKER not in again["answer"] and "travel desk" in again["answer"]
    assert logged(client, again["query_id"]).answer == again["answer"]


def test_deleting_a_collection_redacts_its_answers(
    client: TestClient, keys: Keys, answered: dict[str, Any], database_url: str
) -> None:
    ok(client.delete("/v1/collections/hr", headers=keys.admin), 204)
    assert hits(database_url, MARKER) == {}
    assert logged(client, answered["query_id"]).redacted_at is not None


def test_tenants_delete_leaves_nothing_of_the_tenant(
    client: TestClient,
    keys: Keys,
    answered: dict[str, Any],
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    from ragservice.cli import app
    from ragservice.config import get_settings

    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    # globex has the same kind of data; a failed job of acme still holds its upload.
    upload(client, keys.other_tenant, "hr", [("public", PUBLIC)])
    globex_answer = ask(client, keys.other_tenant, "hr")
    with tenancy.as_system(), db.write() as session:
        acme = store.tenants.find_tenant_id(session, "acme")
        globex = store.tenants.find_tenant_id(session, "globex")
        assert acme is not None and globex is not None
        cid = store.collections.require_collection_id(session, acme, "hr")
        item = store.jobs.JobItem(kind="text", name="x", title=None, body=SECRET.encode())
        store.jobs.enqueue_job(
            session,
            tenant_id=acme,
            collection_id=cid,
            kind=store.jobs.CLI_JOB_KIND,
            params={},
            items=[item],
        )
    assert "ingest_job_items" in hits(database_url, MARKER)
    assert {"tenants", "api_keys", "query_log", "feedback"} <= set(hits(database_url, str(acme)))

    monkeypatch.setenv("RAGSERVICE_DATABASE_URL", database_url)
    get_settings.cache_clear()
    try:
        runner = CliRunner()
        refused = runner.invoke(app, ["tenants", "delete", "acme"], input="n\n")
        assert refused.exit_code == 1 and "nothing erased" in refused.stderr
        assert "tenants" in hits(database_url, str(acme))
        erased = runner.invoke(app, ["tenants", "delete", "acme", "--yes"])
        listed = runner.invoke(app, ["tenants", "list"])
    finally:
        get_settings.cache_clear()

    assert erased.exit_code == 0, erased.output
    counts = dict(line.split("\t") for line in erased.stdout.splitlines())
    assert counts["tenants"] == "1" and counts["api_keys"] == "3"
    assert counts["documents"] == "2" and counts["feedback"] == "1"
    assert hits(database_url, MARKER) == {}
    assert hits(database_url, str(acme)) == {}
    assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == ["default", "globex"]
    # The erase itself is on record for operators, under no tenant.
    owner = make_url(database_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(owner) as conn:
        entries = conn.execute(
            "SELECT tenant_id, target FROM audit_log WHERE action = 'tenant.delete'"
        ).fetchall()
    assert entries == [(None, "acme")]
    # globex is untouched and still served.
    assert logged(client, globex_answer["query_id"]).answer == globex_answer["answer"]
    assert {"tenants", "documents", "query_log"} <= set(hits(database_url, str(globex)))
    assert ask(client, keys.other_tenant, "hr")["cache"]["hit"] is True
    assert client.get("/v1/collections", headers=keys.admin).status_code == 401


def test_the_default_tenant_needs_force_and_stays(
    client: TestClient, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from ragservice.cli import app
    from ragservice.config import get_settings

    monkeypatch.setenv("RAGSERVICE_DATABASE_URL", database_url)
    get_settings.cache_clear()
    try:
        refused = CliRunner().invoke(app, ["tenants", "delete", "default", "--yes"])
        forced = CliRunner().invoke(app, ["tenants", "delete", "default", "--yes", "--force"])
    finally:
        get_settings.cache_clear()
    assert refused.exit_code == 1 and "--force" in refused.stderr
    assert forced.exit_code == 0, forced.output
    assert "tenants" not in forced.stdout
    assert "tenants" in hits(database_url, "00000000-0000-0000-0000-000000000001")
