"""The semantic prompt cache through the API, against a real PostgreSQL: hits, scopes, expiry,
invalidation by document changes, the meaning guard, concurrency, bypass, stats and purge."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from ragservice.cache.prompt_cache import CachePurger, PromptCache
from ragservice.db import tenancy
from ragservice.db.models import PromptCacheEntry, QueryLog
from tests.api.conftest import Keys, ok, wait_for_job
from tests.api.test_query import add_corpus, sse_events

QUESTION = "How many weeks of parental leave do parents get?"


def ask(client: TestClient, headers: dict[str, str], question: str = QUESTION, **extra: Any) -> Any:
    return ok(client.post("/v1/query", json={"question": question, **extra}, headers=headers))


def entries(client: TestClient) -> int:
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.read() as session:
        return int(session.scalar(select(func.count()).select_from(PromptCacheEntry)) or 0)


def update_document(
    client: TestClient, headers: dict[str, str], external_id: str, text: str
) -> None:
    documents = [{"external_id": external_id, "title": "Updated", "text": text}]
    job = ok(
        client.post("/v1/collections/hr/documents", json={"documents": documents}, headers=headers),
        202,
    )
    assert wait_for_job(client, job["id"], headers)["status"] == "done"


def test_exact_and_reworded_questions_hit_and_are_logged(client: TestClient, keys: Keys) -> None:
    add_corpus(client, keys.writer)
    first = ask(client, keys.reader)
    assert first["cache"]["hit"] is False
    again = ask(client, keys.reader, "  how many WEEKS of parental leave do parents get ")
    assert again["cache"]["hit"] is True
    assert again["cache"]["kind"] == "exact"
    assert again["answer"] == first["answer"]
    assert again["citations"] == first["citations"]
    assert set(again["timings_ms"]) == {"cache_lookup", "total"}  # exact: nothing embedded
    ask(client, keys.reader, "Parents get sixteen weeks of leave.")
    filler = ask(client, keys.reader, "Is it true that parents get sixteen weeks of leave?")
    assert filler["cache"]["hit"] is True
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.read() as session:
        logged = session.scalars(select(QueryLog).order_by(QueryLog.created_at)).all()
    assert [row.cache["hit"] for row in logged] == [False, True, False, True]
    assert logged[1].cache["entry_id"] == again["cache"]["entry_id"]


def test_semantic_hit_above_the_threshold(client: TestClient, keys: Keys) -> None:
    add_corpus(client, keys.writer)
    ask(client, keys.reader, "When do new staff receive their laptop?")
    near = ask(client, keys.reader, "When do new staff members receive their laptop?")
    assert near["cache"]["hit"] is True, near["cache"]
    assert near["cache"]["kind"] == "semantic"
    threshold = client.app.state.runtime.settings.cache.similarity_threshold  # type: ignore[attr-defined]
    assert near["cache"]["similarity"] >= threshold


def test_the_meaning_guard_refuses_negations_and_numbers(client: TestClient, keys: Keys) -> None:
    add_corpus(client, keys.writer)
    ask(client, keys.reader, "Parental leave increases staff retention.")
    negated = ask(client, keys.reader, "Parental leave does not increase staff retention.")
    assert negated["cache"]["hit"] is False
    ask(client, keys.reader, "Parents get 16 weeks of parental leave.")
    number = ask(client, keys.reader, "Parents get 18 weeks of parental leave.")
    assert number["cache"]["hit"] is False
    assert number["cache"]["refused"] == "number"


def test_scopes_never_share_entries(client: TestClient, keys: Keys) -> None:
    add_corpus(client, keys.writer)
    add_corpus(client, keys.other_tenant)
    add_corpus(client, keys.writer, name="hr2")
    ask(client, keys.reader, collections=["hr"])
    assert ask(client, keys.reader, collections=["hr"])["cache"]["hit"] is True
    assert ask(client, keys.other_tenant, collections=["hr"])["cache"]["hit"] is False
    assert ask(client, keys.reader, collections=["hr2"])["cache"]["hit"] is False
    assert ask(client, keys.reader, collections=["hr"], k=3)["cache"]["hit"] is False
    assert ask(client, keys.reader, collections=["hr"], mode="dense")["cache"]["hit"] is False
    filtered = ask(client, keys.reader, collections=["hr"], filters={"year": 2025})
    assert filtered["cache"]["hit"] is False


@pytest.mark.parametrize(
    "setting",
    [
        {"bm25_postings_per_term": 50},
        {"binary_rescore_factor": 8},
        {"bm25_exact": False},
        {"rrf_k": 60},
        {"hnsw_ef_search": 7},
    ],
    ids=lambda setting: next(iter(setting)),
)
def test_a_changed_retrieval_setting_is_a_new_scope(
    client: TestClient, keys: Keys, monkeypatch: pytest.MonkeyPatch, setting: dict[str, Any]
) -> None:
    """An operator changes a setting that changes results: answers cached under the old
    ranking are not served (the scope is computed from the resolved search options)."""
    add_corpus(client, keys.writer)
    ask(client, keys.reader)
    assert ask(client, keys.reader)["cache"]["hit"] is True
    answers = client.app.state.answers  # type: ignore[attr-defined]
    monkeypatch.setattr(answers, "_search", answers._search.model_copy(update=setting))
    assert ask(client, keys.reader)["cache"]["hit"] is False
    assert ask(client, keys.reader)["cache"]["hit"] is True


def test_changing_or_deleting_a_source_invalidates_only_its_entries(
    client: TestClient, keys: Keys
) -> None:
    add_corpus(client, keys.writer)
    leave = ask(client, keys.reader, k=1)
    assert [s["document"]["external_id"] for s in leave["sources"]] == ["leave"]
    ask(client, keys.reader, "How do I book flights?", k=1)
    assert entries(client) == 2
    update_document(client, keys.writer, "laptops", "Laptops are handed out on day two.")
    assert ask(client, keys.reader, k=1)["cache"]["hit"] is True  # built from another document
    update_document(client, keys.writer, "leave", "Parents get twenty weeks of paid leave.")
    assert entries(client) == 1  # removed in the same transaction as the change
    fresh = ask(client, keys.reader, k=1)
    assert fresh["cache"]["hit"] is False
    assert "twenty weeks" in fresh["answer"]
    assert ask(client, keys.reader, k=1)["cache"]["hit"] is True
    ok(client.delete("/v1/collections/hr/documents/travel", headers=keys.writer), 204)
    assert ask(client, keys.reader, "How do I book flights?", k=1)["cache"]["hit"] is False


def test_a_new_document_invalidates_the_entries_of_its_collection(
    client: TestClient, keys: Keys
) -> None:
    add_corpus(client, keys.writer)
    add_corpus(client, keys.writer, name="hr2")
    question = "What is the dress code?"
    assert ask(client, keys.reader, question, collections=["hr"], k=1)["cache"]["hit"] is False
    ask(client, keys.reader, question, collections=["hr2"], k=1)
    update_document(client, keys.writer, "dress", "Smart casual clothes; no dress code.")
    fresh = ask(client, keys.reader, question, collections=["hr"], k=1)
    assert fresh["cache"]["hit"] is False
    assert fresh["sources"][0]["document"]["external_id"] == "dress"
    other = ask(client, keys.reader, question, collections=["hr2"], k=1)
    assert other["cache"]["hit"] is True  # another collection: untouched


def test_entries_expire_a_fixed_time_after_creation(client: TestClient, keys: Keys) -> None:
    add_corpus(client, keys.writer)
    patched = ok(
        client.patch("/v1/collections/hr", json={"cache_ttl_seconds": 3}, headers=keys.admin)
    )
    assert patched["cache_ttl_seconds"] == 3
    ask(client, keys.reader)
    time.sleep(1.5)
    assert ask(client, keys.reader)["cache"]["hit"] is True  # a hit does not extend the life
    time.sleep(2.0)
    assert ask(client, keys.reader)["cache"]["hit"] is False  # expired: answered afresh
    services = client.app.state.services  # type: ignore[attr-defined]
    purger = next(s for s in services if isinstance(s, CachePurger))
    assert entries(client) == 1  # the expired entry was replaced by the fresh answer
    time.sleep(3.5)
    assert purger.purge_once() == 1
    assert entries(client) == 0


def test_concurrent_identical_misses_leave_one_entry(client: TestClient, keys: Keys) -> None:
    add_corpus(client, keys.writer)
    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(lambda _: ask(client, keys.reader, "Who books travel?"), range(6)))
    assert len({a["answer"] for a in answers}) == 1
    assert entries(client) == 1
    assert ask(client, keys.reader, "Who books travel?")["cache"]["hit"] is True


def test_bypass_refresh_stream_stats_and_purge(client: TestClient, keys: Keys) -> None:
    add_corpus(client, keys.writer)
    bypassed = ask(client, keys.reader, cache=False)
    assert bypassed["cache"] is None
    assert entries(client) == 0
    first = ask(client, keys.reader)
    refreshed = ask(client, keys.reader, cache_refresh=True)
    assert refreshed["cache"]["hit"] is False
    assert entries(client) == 1
    streamed = client.post(
        "/v1/query", json={"question": QUESTION, "stream": True}, headers=keys.reader
    )
    events = sse_events(streamed.text)
    tokens = "".join(data["text"] for name, data in events if name == "token")
    assert tokens == first["answer"]
    assert events[-1][1]["cache"]["hit"] is True
    assert client.get("/v1/collections/hr/cache", headers=keys.reader).status_code == 403
    stats = ok(client.get("/v1/collections/hr/cache", headers=keys.admin))
    assert stats["entries"] == 1
    assert stats["bytes"] > 0
    assert stats["queries"] == 4
    assert stats["cache_hits"] == 1
    assert stats["hit_rate"] == 0.25
    assert ok(client.delete("/v1/collections/hr/cache", headers=keys.admin)) == {"purged": 1}
    assert ask(client, keys.reader)["cache"]["hit"] is False
    metrics = client.get("/metrics").text
    assert 'ragservice_cache_lookups_total{result="exact_hit"} 1.0' in metrics


def test_a_failing_cache_store_does_not_fail_the_answer(
    client: TestClient, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_corpus(client, keys.writer)

    def deadlock(*_: object, **__: object) -> None:
        raise RuntimeError("deadlock detected")

    monkeypatch.setattr(PromptCache, "put", deadlock)  # the app's one cache
    answer = ask(client, keys.reader)
    assert answer["cache"]["hit"] is False
    assert "[1]" in answer["answer"]
    assert entries(client) == 0
    runtime = client.app.state.runtime  # type: ignore[attr-defined]
    # the query log, written beside it, is kept
    with tenancy.as_system(), runtime.db.read() as session:
        assert (
            session.scalar(select(QueryLog).where(QueryLog.id == uuid.UUID(answer["query_id"])))
            is not None
        )
