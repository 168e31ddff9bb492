"""Feedback through HTTP: validation, tenant scoping, the chat follow-up route, and the
streamed NDJSON export."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from ragservice.db import tenancy
from ragservice.db.models import Feedback, QueryLog
from tests.api.conftest import Keys, ok
from tests.api.test_query import add_corpus

QUESTION = "How long is parental leave?"


@pytest.fixture
def answer(client: TestClient, keys: Keys) -> dict[str, Any]:
    add_corpus(client, keys.writer)
    body = {"question": QUESTION, "collections": ["hr"], "k": 2}
    reply: dict[str, Any] = ok(client.post("/v1/query", json=body, headers=keys.reader))
    return reply


def stored(client: TestClient) -> list[Feedback]:
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.read() as session:
        return list(session.scalars(select(Feedback).order_by(Feedback.created_at)))


def retrieved(client: TestClient, query_id: str) -> list[str]:
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.read() as session:
        logged = session.scalar(select(QueryLog).where(QueryLog.id == uuid.UUID(query_id)))
    assert logged is not None
    return [item["chunk_id"] for item in logged.retrieved]


def all_chunks(client: TestClient, headers: dict[str, str], collection: str) -> dict[str, str]:
    """external id → the id of its (only) chunk."""
    found = {}
    for doc in ("leave", "travel", "laptops"):
        detail = ok(
            client.get(f"/v1/collections/{collection}/documents/{doc}?chunks=true", headers=headers)
        )
        found[doc] = detail["chunks"][0]["id"]
    return found


def test_feedback_is_stored_and_returned(
    client: TestClient, keys: Keys, answer: dict[str, Any]
) -> None:
    cited = answer["citations"][0]["chunk_ids"][0]
    body = {
        "query_id": answer["query_id"],
        "rating": 1,
        "comment": "Spot on.",
        "relevant_chunk_ids": [cited],
    }
    created = ok(client.post("/v1/feedback", json=body, headers=keys.reader), 201)
    assert created["query_id"] == answer["query_id"]
    assert created["rating"] == 1 and created["scale"] == "thumbs"
    assert created["comment"] == "Spot on."
    assert created["corrected_answer"] is None
    assert created["relevant_chunk_ids"] == [cited]
    assert created["irrelevant_chunk_ids"] == []
    [row] = stored(client)
    assert str(row.id) == created["id"]
    assert row.key_id is not None
    assert (row.rating, row.scale, row.comment) == (1, "thumbs", "Spot on.")
    assert (row.relevant_chunk_ids, row.irrelevant_chunk_ids) == ([uuid.UUID(cited)], [])
    # More feedback on the same answer is another row.
    stars = {"query_id": answer["query_id"], "rating": 2, "scale": "stars"}
    ok(client.post("/v1/feedback", json=stars, headers=keys.admin), 201)
    assert [(f.rating, f.scale) for f in stored(client)] == [(1, "thumbs"), (2, "stars")]


def test_a_chunk_of_the_collections_may_be_judged_even_if_not_retrieved(
    client: TestClient, keys: Keys, answer: dict[str, Any]
) -> None:
    chunks = all_chunks(client, keys.reader, "hr")
    seen = set(retrieved(client, answer["query_id"]))
    unseen = [c for c in chunks.values() if c not in seen]
    assert unseen, "k=2 over three documents leaves one chunk out"
    body = {"query_id": answer["query_id"], "rating": -1, "relevant_chunk_ids": unseen}
    created = ok(client.post("/v1/feedback", json=body, headers=keys.reader), 201)
    [row] = stored(client)
    assert str(row.id) == created["id"]
    assert (row.rating, row.scale) == (-1, "thumbs")  # thumbs is the default scale
    assert row.relevant_chunk_ids == [uuid.UUID(c) for c in unseen]
    assert row.irrelevant_chunk_ids == []


def test_unknown_and_other_tenants_answers_are_not_found_alike(
    client: TestClient, keys: Keys, answer: dict[str, Any]
) -> None:
    missing = str(uuid.uuid4())
    unknown = client.post(
        "/v1/feedback", json={"query_id": missing, "rating": 1}, headers=keys.reader
    )
    assert unknown.status_code == 404
    assert unknown.json()["detail"] == f"query {missing} not found"
    theirs = client.post(
        "/v1/feedback",
        json={"query_id": answer["query_id"], "rating": 1},
        headers=keys.other_tenant,
    )
    assert theirs.status_code == 404
    assert theirs.json()["detail"] == f"query {answer['query_id']} not found"
    assert stored(client) == []


@pytest.mark.parametrize(
    ("given", "detail"),
    [
        ({"rating": 0}, "rating: 0 is not a thumbs rating (+1 or -1)"),
        ({"rating": 5}, "rating: 5 is not a thumbs rating (+1 or -1)"),
        ({"rating": 6, "scale": "stars"}, "rating: 6 is not a stars rating (1 to 5)"),
        ({}, "give at least one of rating, comment, corrected_answer"),
        ({"comment": " \n"}, "give at least one of rating, comment, corrected_answer"),
        ({"relevant_chunk_ids": [str(uuid.UUID(int=1))]}, "was not retrieved for query"),
        ({"comment": "x" * 20_001}, "comment: String should have at most 20000 characters"),
        ({"scale": "likes", "rating": 1}, "scale: Input should be 'thumbs' or 'stars'"),
        ({"rating": 1, "extra": True}, "extra: Extra inputs are not permitted"),
    ],
)
def test_invalid_feedback_is_refused_with_422(
    client: TestClient, keys: Keys, answer: dict[str, Any], given: dict[str, Any], detail: str
) -> None:
    body = {"query_id": answer["query_id"], **given}
    refused = client.post("/v1/feedback", json=body, headers=keys.reader)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"] == "InvalidInput"
    assert detail in refused.json()["detail"]
    assert stored(client) == []


def test_chunks_judged_both_ways_or_of_another_tenant_are_refused(
    client: TestClient, keys: Keys, answer: dict[str, Any]
) -> None:
    add_corpus(client, keys.other_tenant)  # globex has its own "hr"
    theirs = all_chunks(client, keys.other_tenant, "hr")["leave"]
    mine = retrieved(client, answer["query_id"])[0]
    query_id = answer["query_id"]
    foreign = {"query_id": query_id, "irrelevant_chunk_ids": [theirs]}
    refused = client.post("/v1/feedback", json=foreign, headers=keys.reader)
    assert refused.status_code == 422
    assert refused.json()["detail"] == (
        f"chunk {theirs} was not retrieved for query {query_id} and is not in one of its "
        "collections"
    )
    both = {"query_id": query_id, "relevant_chunk_ids": [mine], "irrelevant_chunk_ids": [mine]}
    refused = client.post("/v1/feedback", json=both, headers=keys.reader)
    assert refused.status_code == 422
    assert refused.json()["detail"] == f"chunk {mine} is marked both relevant and irrelevant"
    assert stored(client) == []


def test_feedback_needs_a_key(client: TestClient, answer: dict[str, Any]) -> None:
    body = {"query_id": answer["query_id"], "rating": 1}
    assert client.post("/v1/feedback", json=body).status_code == 401


def chat_query_id(reply: dict[str, Any]) -> str:
    extension = reply.get("ragservice")
    found = extension["query_id"] if isinstance(extension, dict) else reply["query_id"]
    return str(found)


def test_chat_follow_up_feedback(client: TestClient, keys: Keys) -> None:
    add_corpus(client, keys.writer)
    body = {"model": "rag:hr", "messages": [{"role": "user", "content": QUESTION}]}
    reply = ok(client.post("/v1/chat/completions", json=body, headers=keys.reader))
    query_id = chat_query_id(reply)
    url = f"/v1/chat/completions/{query_id}/feedback"
    created = ok(client.post(url, json={"rating": 4, "scale": "stars"}, headers=keys.reader), 201)
    assert created["query_id"] == query_id and created["rating"] == 4
    assert client.post(url, json={"rating": 1}, headers=keys.other_tenant).status_code == 404
    with_id = client.post(url, json={"rating": 1, "query_id": query_id}, headers=keys.reader)
    assert with_id.status_code == 422  # the id is in the path
    assert client.post(url, json={}, headers=keys.reader).status_code == 422
    assert [f.rating for f in stored(client)] == [4]


def ndjson(response: Any) -> list[dict[str, Any]]:
    assert response.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in response.text.splitlines()]


def test_export_streams_the_callers_tenants_feedback_as_ndjson(
    client: TestClient, keys: Keys, answer: dict[str, Any]
) -> None:
    chunks = all_chunks(client, keys.reader, "hr")
    correction = "Sixteen weeks, paid [1]."
    body = {
        "query_id": answer["query_id"],
        "rating": -1,
        "corrected_answer": correction,
        "relevant_chunk_ids": [chunks["leave"]],
    }
    ok(client.post("/v1/feedback", json=body, headers=keys.reader), 201)
    add_corpus(client, keys.other_tenant)
    theirs = {"question": "Who gets a laptop?", "collections": ["hr"]}
    other = ok(client.post("/v1/query", json=theirs, headers=keys.other_tenant))
    globex = {"query_id": other["query_id"], "rating": 1, "corrected_answer": "GLOBEX ONLY"}
    ok(client.post("/v1/feedback", json=globex, headers=keys.other_tenant), 201)

    sft = ndjson(client.get("/v1/feedback/export?format=openai-sft", headers=keys.admin))
    assert len(sft) == 1
    messages = sft[0]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert messages[1]["content"].endswith(f"Question: {QUESTION}")
    assert "sixteen weeks" in messages[1]["content"]  # the sources as the model saw them
    assert messages[2] == {"role": "assistant", "content": correction}

    dpo = ndjson(client.get("/v1/feedback/export?format=openai-dpo", headers=keys.admin))
    assert [d["preferred_output"][0]["content"] for d in dpo] == [correction]
    assert dpo[0]["non_preferred_output"][0]["content"] == answer["answer"]
    assert dpo[0]["input"]["messages"] == messages[:2]
    trl = ndjson(client.get("/v1/feedback/export?format=trl-dpo", headers=keys.admin))
    assert trl == [
        {
            "prompt": messages[:2],
            "chosen": [{"role": "assistant", "content": correction}],
            "rejected": [{"role": "assistant", "content": answer["answer"]}],
        }
    ]
    triplets = ndjson(
        client.get("/v1/feedback/export?format=triplets&collection=hr", headers=keys.admin)
    )
    assert triplets and all(list(t) == ["anchor", "positive", "negative"] for t in triplets)
    assert {t["anchor"] for t in triplets} == {QUESTION}
    assert {t["positive"] for t in triplets} == {
        "Parents get sixteen weeks of paid parental leave."
    }

    for fmt in ("openai-sft", "openai-dpo", "trl-dpo", "triplets"):
        mine = client.get(f"/v1/feedback/export?format={fmt}", headers=keys.admin)
        assert mine.status_code == 200
        assert "GLOBEX" not in mine.text and "globex" not in mine.text.lower()
    theirs_export = ndjson(
        client.get("/v1/feedback/export?format=openai-sft", headers=keys.other_tenant)
    )
    assert [r["messages"][-1]["content"] for r in theirs_export] == ["GLOBEX ONLY"]


def test_export_filters_and_refusals(
    client: TestClient, keys: Keys, answer: dict[str, Any]
) -> None:
    body = {"query_id": answer["query_id"], "rating": 1}
    ok(client.post("/v1/feedback", json=body, headers=keys.reader), 201)
    url = "/v1/feedback/export?format=openai-sft"
    assert len(ndjson(client.get(url, headers=keys.admin))) == 1
    assert ndjson(client.get(url + "&min_rating=2", headers=keys.admin)) == []
    assert ndjson(client.get(url + "&since=2999-01-01", headers=keys.admin)) == []
    assert len(ndjson(client.get(url + "&until=2999-01-01T00:00:00Z", headers=keys.admin))) == 1
    assert client.get(url, headers=keys.writer).status_code == 403
    assert client.get(url + "&collection=nope", headers=keys.admin).status_code == 404
    bad_format = client.get("/v1/feedback/export?format=csv", headers=keys.admin)
    assert bad_format.status_code == 422
    inverted = client.get(url + "&min_rating=3&max_rating=1", headers=keys.admin)
    assert inverted.status_code == 422
    assert inverted.json()["detail"] == "min_rating is above max_rating"
