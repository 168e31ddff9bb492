"""`POST /v1/query` with extractive answers (no inference layer), embeddings, metrics."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from ragservice.api.app import create_app
from ragservice.config import Settings
from ragservice.db import tenancy
from ragservice.db.models import QueryLog
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from tests.api.conftest import Keys, ok, wait_for_job

DOCUMENTS = [
    ("leave", "Parental leave", "Parents get sixteen weeks of paid parental leave.", 2025),
    ("travel", "Travel", "Book flights through the travel desk two weeks ahead.", 2024),
    ("laptops", "Laptops", "New staff receive a laptop on their first day.", 2025),
]


def add_corpus(client: TestClient, headers: dict[str, str], name: str = "hr") -> None:
    ok(client.post("/v1/collections", json={"name": name}, headers=headers), 201)
    documents = [
        {"external_id": i, "title": t, "text": x, "metadata": {"year": y}}
        for i, t, x, y in DOCUMENTS
    ]
    job = ok(
        client.post(
            f"/v1/collections/{name}/documents", json={"documents": documents}, headers=headers
        ),
        202,
    )
    assert wait_for_job(client, job["id"], headers)["status"] == "done"


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_extractive_answer_cites_the_right_chunks_and_is_logged(
    client: TestClient, keys: Keys
) -> None:
    add_corpus(client, keys.writer)
    body = {"question": "How long is parental leave?", "collections": ["hr"], "k": 3}
    answer = ok(client.post("/v1/query", json=body, headers=keys.reader))
    assert answer["model"] == "extractive"
    assert answer["status"] == "extractive"
    assert "[1]" in answer["answer"]
    assert "sixteen weeks" in answer["answer"]
    first = answer["citations"][0]
    assert first["number"] == 1
    assert first["document"]["external_id"] == "leave"
    source = answer["sources"][0]
    assert source["number"] == 1
    assert source["chunk_ids"] == first["chunk_ids"]
    assert "sixteen weeks" in source["text"]
    assert {"embed", "search", "context", "generate", "total"} <= set(answer["timings_ms"])
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.read() as session:
        logged = session.scalar(
            select(QueryLog).where(QueryLog.id == uuid.UUID(answer["query_id"]))
        )
    assert logged is not None
    assert logged.question == body["question"]
    assert logged.status == "extractive"
    assert logged.answer == answer["answer"]
    assert logged.retrieved[0]["chunk_id"] == str(first["chunk_ids"][0])
    assert logged.endpoint == "query"


def test_the_context_never_exceeds_its_token_budget(
    settings: Settings, embedder: SentenceTransformerEmbedder
) -> None:
    tight = settings.model_copy(update={"auth_disabled": True, "context_max_tokens": 30})
    from ingest.worker import JobWorker

    with TestClient(create_app(tight, embedder=embedder, services=[JobWorker])) as client:
        add_corpus(client, {})
        answer = ok(client.post("/v1/query", json={"question": "leave, travel and laptops"}))
    text = "\n\n".join(
        f"[{s['number']}] {s['document']['title']}\n{s['text']}" for s in answer["sources"]
    )
    assert len(embedder.tokenizer.token_spans(text)) <= 30
    assert answer["sources"]


def test_streamed_extractive_answer(client: TestClient, keys: Keys) -> None:
    add_corpus(client, keys.writer)
    body = {"question": "When do new staff get a laptop?", "stream": True}
    response = client.post("/v1/query", json=body, headers=keys.reader)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert [name for name, _ in events] == ["token", "citations", "done"]
    done = events[-1][1]
    assert events[0][1]["text"] == done["answer"]
    assert events[1][1]["citations"][0]["document"]["external_id"] == "laptops"
    assert events[1][1]["sources"][0]["number"] == 1
    assert {"query_id", "model", "status", "timings_ms"} <= set(done)


def test_query_errors(client: TestClient, keys: Keys) -> None:
    add_corpus(client, keys.writer)
    assert client.post("/v1/query", json={"question": "x"}).status_code == 401
    missing = client.post(
        "/v1/query", json={"question": "x", "collections": ["nope"]}, headers=keys.reader
    )
    assert missing.status_code == 404
    assert client.post("/v1/query", json={"question": " "}, headers=keys.reader).status_code == 422
    assert (
        client.post(
            "/v1/query", json={"question": "x", "k": 10_000}, headers=keys.reader
        ).status_code
        == 422
    )


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_embeddings_endpoint(
    client: TestClient, keys: Keys, embedder: SentenceTransformerEmbedder, encoding: str
) -> None:
    texts = ["first text", "second, longer text about pumps"]
    reply = ok(
        client.post(
            "/v1/embeddings",
            json={"input": texts, "model": embedder.name, "encoding_format": encoding},
            headers=keys.reader,
        )
    )
    assert reply["object"] == "list"
    assert reply["model"] == embedder.name
    assert reply["usage"]["prompt_tokens"] > 0
    vectors = [
        np.frombuffer(base64.b64decode(row["embedding"]), dtype="<f4")
        if encoding == "base64"
        else np.asarray(row["embedding"], dtype=np.float32)
        for row in reply["data"]
    ]
    assert [row["index"] for row in reply["data"]] == [0, 1]
    np.testing.assert_allclose(np.stack(vectors), embedder.embed(texts), atol=1e-5)
    single = ok(client.post("/v1/embeddings", json={"input": "first text"}, headers=keys.reader))
    np.testing.assert_allclose(single["data"][0]["embedding"], vectors[0], atol=1e-5)
    bad = client.post("/v1/embeddings", json={"input": "x", "dimensions": 3}, headers=keys.reader)
    assert bad.status_code == 422


def test_metrics_count_requests_and_stages(client: TestClient, keys: Keys) -> None:
    add_corpus(client, keys.writer)
    ok(client.post("/v1/query", json={"question": "travel desk"}, headers=keys.reader))
    client.get("/v1/collections/none", headers=keys.reader)
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    text = metrics.text
    assert (
        'ragservice_http_requests_total{method="POST",route="/v1/query",status="200"} 1.0' in text
    )
    assert 'route="/v1/collections/{name}",status="404"' in text
    assert 'ragservice_pipeline_stage_seconds_count{stage="search"} 1.0' in text


def test_neighbouring_chunks_join_a_hit_for_continuity(
    settings: Settings, embedder: SentenceTransformerEmbedder
) -> None:
    from ingest.worker import JobWorker

    small = settings.model_copy(
        update={
            "auth_disabled": True,
            "chunk_max_tokens": 24,
            "chunk_overlap_tokens": 0,
            "context_neighbours": 1,
        }
    )
    sentences = [
        "The cafeteria opens at eight in the morning on weekdays for all staff members.",
        "Breakfast includes porridge, fresh fruit, yoghurt and several kinds of bread rolls.",
        "Hot lunches are served from noon until two, with a vegetarian dish every day.",
        "The evening snack bar closes at six, and weekend hours are posted near the door.",
    ]
    with TestClient(create_app(small, embedder=embedder, services=[JobWorker])) as client:
        ok(client.post("/v1/collections", json={"name": "food"}), 201)
        documents = [{"external_id": "cafeteria", "text": " ".join(sentences)}]
        job = ok(client.post("/v1/collections/food/documents", json={"documents": documents}), 202)
        assert wait_for_job(client, job["id"], {})["status"] == "done"
        chunks = ok(client.get("/v1/collections/food/documents/cafeteria?chunks=true"))["chunks"]
        assert len(chunks) >= 3
        body = {"question": "vegetarian lunch noon", "k": 1, "mode": "fulltext"}
        answer = ok(client.post("/v1/query", json=body))
    (source,) = answer["sources"]
    hit = next(c for c in chunks if "vegetarian" in c["text"])
    neighbours = [c for c in chunks if abs(c["ordinal"] - hit["ordinal"]) == 1]
    assert len(source["chunk_ids"]) == 1 + len(neighbours)
    assert {str(c["id"]) for c in [hit, *neighbours]} == set(source["chunk_ids"])
    for chunk in [hit, *neighbours]:
        assert chunk["text"] in source["text"]
