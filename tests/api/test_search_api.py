"""`POST /v1/search` over HTTP: the three modes, the result shape, filters, k."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import Keys, ok, wait_for_job

DOCUMENTS = [
    ("pg", "PostgreSQL replication", "Streaming replicas replay the primary's WAL.", 2019),
    ("hnsw", "HNSW graphs", "Hierarchical navigable small world graphs index vectors.", 2021),
    ("bm25", "BM25 ranking", "Okapi BM25 scores term frequency against document length.", 2022),
    ("cats", "Cats", "Cats sleep for most of the day and purr when content.", 2023),
]


@pytest.fixture
def corpus(client: TestClient, keys: Keys) -> str:
    ok(client.post("/v1/collections", json={"name": "kb"}, headers=keys.writer), 201)
    documents = [
        {"external_id": i, "title": t, "text": x, "metadata": {"year": y}}
        for i, t, x, y in DOCUMENTS
    ]
    job = ok(
        client.post(
            "/v1/collections/kb/documents", json={"documents": documents}, headers=keys.writer
        ),
        202,
    )
    assert wait_for_job(client, job["id"], keys.writer)["status"] == "done"
    return "kb"


@pytest.mark.parametrize("mode", ["dense", "fulltext", "hybrid"])
def test_each_mode_finds_the_right_document(
    client: TestClient, keys: Keys, corpus: str, mode: str
) -> None:
    body = {"query": "Okapi BM25 term frequency", "collections": [corpus], "mode": mode, "k": 3}
    result = ok(client.post("/v1/search", json=body, headers=keys.reader))
    assert result["mode"] == mode
    top = result["results"][0]
    assert top["document"]["external_id"] == "bm25"
    assert top["document"]["title"] == "BM25 ranking"
    assert top["document"]["metadata"] == {"year": 2022}
    assert top["collection"] == "kb"
    assert "Okapi BM25" in top["text"]
    assert top["ordinal"] == 0
    assert 0 <= top["start_char"] < top["end_char"]
    scores = [hit["score"] for hit in result["results"]]
    assert scores == sorted(scores, reverse=True)
    assert len(result["results"]) <= 3
    assert "total" in result["timings_ms"]


def test_hybrid_is_the_default_mode(client: TestClient, keys: Keys, corpus: str) -> None:
    result = ok(client.post("/v1/search", json={"query": "vector index"}, headers=keys.reader))
    assert result["mode"] == "hybrid"
    assert result["results"][0]["document"]["external_id"] == "hnsw"


def test_filters_restrict_results(client: TestClient, keys: Keys, corpus: str) -> None:
    body = {"query": "graphs and replicas", "filters": {"year": {"$lte": 2021}}, "k": 10}
    result = ok(client.post("/v1/search", json=body, headers=keys.reader))
    assert {hit["document"]["external_id"] for hit in result["results"]} == {"pg", "hnsw"}
    body = {"query": "anything", "mode": "dense", "filters": {"year": {"$in": [2023]}}}
    result = ok(client.post("/v1/search", json=body, headers=keys.reader))
    assert [hit["document"]["external_id"] for hit in result["results"]] == ["cats"]


def test_k_bounds_the_result_count(client: TestClient, keys: Keys, corpus: str) -> None:
    body = {"query": "the", "mode": "dense", "k": 2}
    assert len(ok(client.post("/v1/search", json=body, headers=keys.reader))["results"]) == 2


def test_ranking_overrides_are_bounded_and_stay_in_the_tenant(
    client: TestClient, keys: Keys, corpus: str
) -> None:
    ranking = {"fusion": "minmax", "adaptive_weight": True, "prf": "rm3", "document_share": 0.2}
    body = {"query": "BM25 term frequency", "group_by": "document", "ranking": ranking, "k": 10}
    result = ok(client.post("/v1/search", json=body, headers=keys.reader))
    found = [hit["document"]["external_id"] for hit in result["results"]]
    assert found[0] == "bm25" and len(found) == len(set(found))
    for bad in ({"prf_docs": 51}, {"fusion": "max"}, {"text_weight": 2}, {"k1": 1}):
        response = client.post("/v1/search", json={**body, "ranking": bad}, headers=keys.reader)
        assert response.status_code == 422, bad
    # Another tenant's search with the same overrides finds nothing of acme's.
    other = client.post("/v1/search", json=body, headers=keys.other_tenant)
    assert other.status_code == 200 and other.json()["results"] == []
