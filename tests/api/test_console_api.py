"""The endpoints the web console needs: who the caller is, the embedding models, the prompt
cache's entries and the insights an analyst would read in SQL, each scoped to the caller."""

from __future__ import annotations

import uuid
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
from fastapi.testclient import TestClient
from psycopg.rows import dict_row

from ragservice import store
from ragservice.api.app import create_app
from ragservice.auth.keys import new_key
from ragservice.config import DEFAULT_TENANT_ID, DEFAULT_TENANT_NAME, Settings
from ragservice.db import tenancy
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from ragservice.runtime import Runtime
from tests.api.conftest import Keys, ok
from tests.api.test_query import add_corpus
from tests.integration.test_analytics import libpq, new_analyst

QUESTION = "How many weeks of parental leave do parents get?"
GLOBEX_QUESTION = "globex: when do new staff receive a laptop?"


def runtime_of(client: TestClient) -> Runtime:
    runtime: Runtime = client.app.state.runtime  # type: ignore[attr-defined]
    return runtime


def service_admin_key(client: TestClient) -> dict[str, str]:
    """An admin key of the default tenant: the service operator's."""
    key = new_key()
    with tenancy.as_system(), runtime_of(client).db.write() as session:
        tenant_id = store.tenants.ensure_tenant(session, DEFAULT_TENANT_NAME)
        store.tenants.create_api_key(
            session, tenant_id=tenant_id, role="admin", prefix=key.prefix, key_hash=key.hash
        )
    return {"Authorization": f"Bearer {key.secret}"}


def test_me_tells_the_tenant_role_and_limits(
    client: TestClient, keys: Keys, api_settings: Settings, embedder: SentenceTransformerEmbedder
) -> None:
    reader = ok(client.get("/v1/me", headers=keys.reader))
    assert reader["tenant"]["name"] == "acme"
    assert reader["role"] == "reader"
    assert reader["auth_disabled"] is False
    assert reader["service_admin"] is False
    assert reader["key_prefix"].startswith("rsk_")
    assert keys.reader["Authorization"].removeprefix("Bearer ").startswith(reader["key_prefix"])
    assert reader["max_file_bytes"] == api_settings.limits.max_file_bytes
    assert reader["max_files_per_upload"] == api_settings.limits.max_files_per_upload
    assert reader["cache_enabled"] is api_settings.cache.enabled
    assert reader["answer_model"] == "extractive"  # no upstream configured

    admin = ok(client.get("/v1/me", headers=keys.admin))
    assert (admin["role"], admin["tenant"]) == ("admin", reader["tenant"])
    assert admin["service_admin"] is False  # an admin of acme, not of the service
    other = ok(client.get("/v1/me", headers=keys.other_tenant))
    assert other["tenant"]["name"] == "globex"
    assert other["tenant"]["id"] != reader["tenant"]["id"]
    assert client.get("/v1/me").status_code == 401

    off = api_settings.model_copy(update={"auth_disabled": True})
    with TestClient(create_app(off, embedder=embedder)) as unauthenticated:
        me = ok(unauthenticated.get("/v1/me"))
    assert me["tenant"] == {"id": DEFAULT_TENANT_ID, "name": "default"}
    assert (me["role"], me["auth_disabled"], me["service_admin"]) == ("admin", True, True)
    assert me["key_prefix"] is None


def test_models_are_listed_to_admins_and_switched_by_the_service_admin_only(
    client: TestClient, keys: Keys, tiny_path: Path
) -> None:
    add_corpus(client, keys.writer)
    with tenancy.as_system(), runtime_of(client).db.read() as session:
        chunks = store.embedding_models.chunk_total(session)
    # Its own transaction, as `finetune` registers a version: on Citus a new model's index
    # DDL may not follow a read of every shard in the same transaction.
    with tenancy.as_system(), runtime_of(client).db.write() as session:
        tiny = store.embedding_models.register_model_version(
            session,
            name="tiny",
            version=1,
            dimension=32,
            path=str(tiny_path),
            base_model_id=None,
            details={"held_out": {"before": {"ndcg@10": 0.5}, "after": {"ndcg@10": 0.6}}},
            hnsw_m=16,
            hnsw_ef_construction=64,
        )
        tiny_id = tiny.id
    service = service_admin_key(client)

    listed = ok(client.get("/v1/admin/models", headers=service))
    assert listed["can_switch"] is True
    by_name = {row["name"]: row for row in listed["models"]}
    served = next(row for row in listed["models"] if row["active"])
    assert (served["embedded"], served["chunks"]) == (chunks, chunks)
    assert by_name["tiny"]["held_out"] == {"before": {"ndcg@10": 0.5}, "after": {"ndcg@10": 0.6}}
    assert (by_name["tiny"]["active"], by_name["tiny"]["embedded"]) == (False, 0)
    assert "path" not in by_name["tiny"]
    acme = ok(client.get("/v1/admin/models", headers=keys.admin))
    assert acme["can_switch"] is False and len(acme["models"]) == len(listed["models"])
    assert {row["chunks"] for row in acme["models"]} == {chunks}  # acme's are all there are
    # Another tenant's admin sees the models, never how much acme has embedded.
    globex = ok(client.get("/v1/admin/models", headers=keys.other_tenant))
    assert {row["chunks"] for row in globex["models"]} == {0}
    assert client.get("/v1/admin/models", headers=keys.writer).status_code == 403

    switch = {"model": "tiny:1"}
    refused = client.post("/v1/admin/models/activate", json=switch, headers=keys.other_tenant)
    assert refused.status_code == 403 and "default tenant" in refused.json()["detail"]
    assert (
        client.post("/v1/admin/models/activate", json=switch, headers=keys.admin).status_code == 403
    )
    assert client.post("/v1/admin/models/rollback", json={}, headers=keys.writer).status_code == 403
    unknown = client.post("/v1/admin/models/activate", json={"model": "nope"}, headers=service)
    assert unknown.status_code == 404
    missing = client.post("/v1/admin/models/activate", json=switch, headers=service)
    assert missing.status_code == 409
    assert f"no embedding for {chunks} chunks" in missing.json()["detail"]

    forced = ok(
        client.post("/v1/admin/models/activate", json={**switch, "force": True}, headers=service)
    )
    assert forced["changed"] is True and forced["previous_id"] == served["id"]
    assert (forced["model"]["id"], forced["model"]["active"]) == (tiny_id, True)
    back = ok(client.post("/v1/admin/models/rollback", json={}, headers=service))
    assert back["changed"] is True and back["previous_id"] == tiny_id
    assert (back["model"]["id"], back["model"]["active"]) == (served["id"], True)
    with tenancy.as_system(), runtime_of(client).db.read() as session:
        entries = store.audit.list_entries(session, None, limit=2)
    prefix = service["Authorization"].removeprefix("Bearer ")[:12]
    assert [(e.action, e.actor, e.tenant_id) for e in entries] == [
        ("model.rollback", f"key:{prefix}", None),
        ("model.activate", f"key:{prefix}", None),
    ]
    assert all(e.key_id is not None for e in entries)


def ask(client: TestClient, headers: dict[str, str], question: str, **extra: Any) -> Any:
    return ok(client.post("/v1/query", json={"question": question, **extra}, headers=headers))


def status(client: TestClient, path: str, headers: dict[str, str]) -> int:
    return client.get(path, headers=headers).status_code


def rate_badly(client: TestClient, headers: dict[str, str], query_id: str, comment: str) -> None:
    feedback = {"query_id": query_id, "rating": -1, "comment": comment}
    ok(client.post("/v1/feedback", json=feedback, headers=headers), 201)


def test_cache_entries_and_insights_show_the_tenants_own_questions(
    client: TestClient, keys: Keys, api_settings: Settings, database_url: str
) -> None:
    add_corpus(client, keys.writer)
    add_corpus(client, keys.other_tenant)  # globex has an "hr" collection too
    ok(client.post("/v1/collections", json={"name": "empty"}, headers=keys.writer), 201)
    first = ask(client, keys.reader, QUESTION, collections=["hr"])
    assert ask(client, keys.reader, QUESTION, collections=["hr"])["cache"]["hit"] is True
    unanswered = ask(client, keys.reader, "Who cleans the offices?", collections=["empty"])
    rate_badly(client, keys.reader, first["query_id"], "too vague")
    theirs = ask(client, keys.other_tenant, GLOBEX_QUESTION)
    rate_badly(client, keys.other_tenant, theirs["query_id"], "globex comment")

    page = ok(client.get("/v1/collections/hr/cache/entries", headers=keys.admin))
    [entry] = page["entries"]
    assert (entry["question"], entry["hits"], entry["model"]) == (QUESTION, 1, "extractive")
    assert entry["answer"] == first["answer"] and entry["bytes"] > 0
    assert entry["expires_at"] > entry["created_at"]
    assert page["ttl_seconds"] is None
    assert page["default_ttl_seconds"] == api_settings.cache.ttl_seconds
    globex_page = ok(client.get("/v1/collections/hr/cache/entries", headers=keys.other_tenant))
    assert [e["question"] for e in globex_page["entries"]] == [GLOBEX_QUESTION]
    entries = "/v1/collections/{}/cache/entries"
    assert status(client, entries.format("empty"), keys.other_tenant) == 404
    assert status(client, entries.format("hr"), keys.writer) == 403
    assert status(client, entries.format("hr") + "?limit=201", keys.admin) == 422

    found = ok(client.get("/v1/insights", headers=keys.admin))
    assert found["days"] == 30
    assert sum(day["queries"] for day in found["queries_per_day"]) == 3
    assert sum(day["hits"] for day in found["cache_per_day"]) == 1
    assert "total" in {stage["stage"] for stage in found["stage_latency"]}
    assert [w["query_id"] for w in found["weakest"]][:1] == [unanswered["query_id"]]
    assert found["weakest"][0]["top_score"] is None
    [bad] = found["negative_feedback"]
    assert (bad["query_id"], bad["question"], bad["rating"]) == (first["query_id"], QUESTION, -1)
    assert (bad["comment"], bad["answer"]) == ("too vague", first["answer"])
    assert "globex" not in str(found)  # another tenant's questions and comments never show
    assert "globex" in str(ok(client.get("/v1/insights", headers=keys.other_tenant)))
    narrowed = ok(client.get("/v1/insights?days=1&collection=empty", headers=keys.admin))
    assert sum(day["queries"] for day in narrowed["queries_per_day"]) == 1
    assert narrowed["negative_feedback"] == []
    assert status(client, "/v1/insights?collection=empty", keys.other_tenant) == 404
    assert status(client, "/v1/insights?days=366", keys.admin) == 422
    assert status(client, "/v1/insights", keys.writer) == 403

    tenant_id = uuid.UUID(ok(client.get("/v1/me", headers=keys.admin))["tenant"]["id"])
    with new_analyst(runtime_of(client).db, tenant_id) as analyst:
        views = read_views(libpq(database_url, *analyst))
    assert_same_figures(
        found, ok(client.get("/v1/insights?collection=hr", headers=keys.admin)), views
    )


def read_views(url: str) -> dict[str, list[dict[str, Any]]]:
    """What an analyst bound to the tenant reads in the views over the last 30 UTC days, in
    the endpoint's shapes and order (docs/analysts.md)."""
    since = "current_date - 29"
    queries = {
        "queries_per_day": "SELECT day, sum(queries) AS queries FROM analytics.queries_per_day "
        f"WHERE collection = 'hr' AND day >= {since} GROUP BY day ORDER BY day",
        "cache_per_day": "SELECT day, lookups, hits, hit_rate FROM analytics.cache_hit_rate "
        f"WHERE day >= {since} ORDER BY day",
        "stage_latency": "SELECT day, stage, samples, p50_ms, p95_ms FROM analytics.stage_latency "
        f"WHERE day >= {since}",
        "weakest": "SELECT query_id, question, top_score, created_at, reason "
        f"FROM analytics.weak_retrieval WHERE created_at >= {since} "
        "ORDER BY top_score ASC NULLS FIRST, created_at DESC, query_id LIMIT 10",
        "negative_feedback": "SELECT query_id, question, answer, scale, rating, comment, "
        "corrected_answer, created_at FROM analytics.negative_feedback "
        f"WHERE created_at >= {since} ORDER BY created_at DESC, feedback_id LIMIT 10",
    }
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        return {name: conn.execute(query).fetchall() for name, query in queries.items()}


def assert_same_figures(
    found: dict[str, Any], found_hr: dict[str, Any], views: dict[str, list[dict[str, Any]]]
) -> None:
    """The view's queries per day are per collection (`found_hr`: the endpoint's for "hr")."""

    def listed(rows: list[dict[str, Any]], *fields: str) -> list[tuple[Any, ...]]:
        return [tuple(_plain(row[f]) for f in fields) for row in rows]

    assert listed(found_hr["queries_per_day"], "day", "queries") == listed(
        views["queries_per_day"], "day", "queries"
    )
    cache = ("day", "lookups", "hits", "hit_rate")
    assert listed(found["cache_per_day"], *cache) == listed(views["cache_per_day"], *cache)
    if len({row["day"] for row in views["stage_latency"]}) == 1:  # not across a UTC midnight
        stages = {
            s["stage"]: (s["count"], s["p50_ms"], s["p95_ms"]) for s in found["stage_latency"]
        }
        assert stages == {
            row["stage"]: (row["samples"], row["p50_ms"], row["p95_ms"])
            for row in views["stage_latency"]
        }
    weak = ("query_id", "question", "top_score", "created_at", "reason")
    assert listed(found["weakest"], *weak) == listed(views["weakest"], *weak)
    negative = ("query_id", "question", "answer", "rating", "comment", "corrected_answer")
    assert listed(found["negative_feedback"], *negative, "created_at") == listed(
        views["negative_feedback"], *negative, "created_at"
    )


def _plain(value: Any) -> Any:
    """A view's value and the endpoint's JSON value alike: text for ids, days and times."""
    if isinstance(value, uuid.UUID | date):
        return str(value) if not isinstance(value, datetime) else value
    if isinstance(value, str) and len(value) > 19 and value[10:11] == "T":
        return datetime.fromisoformat(value)
    if isinstance(value, Decimal):
        return float(value)
    return value
