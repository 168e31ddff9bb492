"""Switching the embedding model under a running API: searches during activation and rollback,
the cache scope following the model, and fine-tuning from feedback given through the API."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from ingest.worker import JobWorker
from ragservice import store
from ragservice.api.app import create_app
from ragservice.config import Settings, get_settings
from ragservice.db import tenancy
from ragservice.db.models import EmbeddingModel
from ragservice.embedding import registry
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from ragservice.embedding.reembed import reembed
from ragservice.runtime import Runtime
from tests.api.conftest import Keys, ok
from tests.api.test_query import add_corpus


@pytest.fixture
def client(api_settings: Settings, embedder: SentenceTransformerEmbedder) -> Iterator[TestClient]:
    """The API with the model check every 0.1 s, so that tests see switches quickly."""
    # Three threads search as fast as they can: no rate limit in the way.
    fast = api_settings.model_copy(update={"model_check_seconds": 0.1, "rate_limit_per_second": 0})
    app = create_app(fast, embedder=embedder, services=[JobWorker])
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


def runtime_of(client: TestClient) -> Runtime:
    runtime: Runtime = client.app.state.runtime  # type: ignore[attr-defined]
    return runtime


def add_tiny_model(client: TestClient, path: Path) -> EmbeddingModel:
    """The tiny model registered as `tiny` v1 and embedded over the whole corpus."""
    runtime = runtime_of(client)
    with tenancy.as_system(), runtime.db.write() as session:
        row = store.embedding_models.register_model_version(
            session,
            name="tiny",
            version=1,
            dimension=32,
            path=str(path),
            base_model_id=None,
            details={},
            hnsw_m=16,
            hnsw_ef_construction=64,
        )
    loaded = registry.load_embedder(runtime.settings, row)
    reembed(runtime.db, runtime.settings.indexing, row, loaded, batch_size=2)
    return row


def serving(client: TestClient, admin: dict[str, str]) -> dict[str, Any]:
    """The model the server says it serves (the details of readiness are for admin keys)."""
    model: dict[str, Any] = ok(client.get("/v1/admin/health", headers=admin))["model"]
    return model


def wait_for_model(client: TestClient, admin: dict[str, str], model_id: int) -> None:
    deadline = time.monotonic() + 30
    while serving(client, admin)["id"] != model_id:
        assert time.monotonic() < deadline, f"the server did not switch to model {model_id}"
        time.sleep(0.05)


class Searching:
    """Threads searching through the API until stopped, keeping every outcome."""

    def __init__(self, client: TestClient, headers: dict[str, str], threads: int = 3) -> None:
        self.client = client
        self.headers = headers
        self.outcomes: list[tuple[int, int | None, int]] = []  # status, model id, hits
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, args=(mode,))
            for mode in ("dense", "hybrid", "dense")[:threads]
        ]

    def __enter__(self) -> Searching:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def _run(self, mode: str) -> None:
        body = {"query": "How long is parental leave?", "k": 3, "mode": mode}
        while not self.stop.is_set():
            response = self.client.post("/v1/search", json=body, headers=self.headers)
            found = response.json() if response.status_code == 200 else {}
            model = (found.get("embedding_model") or {}).get("id")
            self.outcomes.append((response.status_code, model, len(found.get("results", []))))

    def seen_since(self, start: int) -> set[int | None]:
        return {model for _, model, _ in self.outcomes[start:]}


def test_activation_and_rollback_while_searching(
    client: TestClient, keys: Keys, tiny_path: Path
) -> None:
    add_corpus(client, keys.writer)
    runtime = runtime_of(client)
    base = serving(client, keys.admin)
    assert base["name"] == "sentence-transformers/all-MiniLM-L6-v2"
    tiny = add_tiny_model(client, tiny_path)
    with Searching(client, keys.reader) as searching:
        time.sleep(0.3)
        registry.activate(runtime.db, "tiny")
        wait_for_model(client, keys.admin, tiny.id)
        switched = len(searching.outcomes)
        time.sleep(0.3)
        registry.rollback(runtime.db)
        wait_for_model(client, keys.admin, base["id"])
        rolled_back = len(searching.outcomes)
        time.sleep(0.3)
    statuses = {status for status, _, _ in searching.outcomes}
    assert statuses == {200}, [o for o in searching.outcomes if o[0] != 200][:3]
    # The 384-d and 32-d models share no index: a search that mixed them would fail, not 200.
    assert all(hits == 3 for _, _, hits in searching.outcomes)
    assert searching.seen_since(0) == {base["id"], tiny.id}
    assert tiny.id in searching.seen_since(switched)
    # Searches that started before the switch back may finish after it: the tail is the base.
    assert searching.outcomes[-1][1] == base["id"]
    assert rolled_back < len(searching.outcomes)
    found = ok(client.post("/v1/search", json={"query": "laptop"}, headers=keys.reader))
    assert found["embedding_model"] == {"id": base["id"], "name": base["name"], "version": 1}


def test_activation_changes_the_cache_scope(
    client: TestClient, keys: Keys, tiny_path: Path
) -> None:
    add_corpus(client, keys.writer)
    runtime = runtime_of(client)
    base = serving(client, keys.admin)["id"]
    tiny = add_tiny_model(client, tiny_path)

    def ask() -> dict[str, Any]:
        body = {"question": "How long is parental leave?", "collections": ["hr"]}
        answer: dict[str, Any] = ok(client.post("/v1/query", json=body, headers=keys.reader))
        return answer

    def hits() -> bool:
        # The cache entry is stored after the response; wait for it like a later caller would.
        time.sleep(0.2)
        return bool(ask()["cache"]["hit"])

    assert ask()["cache"]["hit"] is False
    assert hits() is True
    registry.activate(runtime.db, "tiny")
    wait_for_model(client, keys.admin, tiny.id)
    assert hits() is False  # the old model's entries are out of scope now
    assert hits() is True  # and the new model caches its own
    registry.rollback(runtime.db)
    wait_for_model(client, keys.admin, base)
    assert hits() is True  # the first model's entry serves again
    # The model served before stays loaded: /v1/embeddings embeds with it when asked by name.
    for name in ("tiny", "tiny:1"):
        body = {"input": ["parental leave"], "model": name}
        embedded = ok(client.post("/v1/embeddings", json=body, headers=keys.reader))
        assert embedded["model"] == "tiny:1"
        assert len(embedded["data"][0]["embedding"]) == 32
    models = ok(client.get("/v1/models", headers=keys.reader))["data"]
    embedding_models = [(m["id"], m["dimension"]) for m in models if m["type"] == "embedding"]
    assert embedding_models == [("sentence-transformers/all-MiniLM-L6-v2", 384), ("tiny:1", 32)]


def test_finetune_from_feedback_given_through_the_api(
    client: TestClient, keys: Keys, tiny_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_corpus(client, keys.writer)
    questions = [
        "How long is parental leave?",
        "When do I book flights?",
        "When do new staff get a laptop?",
        "Who books the travel?",
    ]
    for question in questions:
        body = {"question": question, "collections": ["hr"], "k": 3, "cache": False}
        answer = ok(client.post("/v1/query", json=body, headers=keys.reader))
        time.sleep(0.1)  # the query log is written after the response
        ranked = [c for source in answer["sources"] for c in source["chunk_ids"]]
        feedback = {
            "query_id": answer["query_id"],
            "relevant_chunk_ids": ranked[:1],
            "irrelevant_chunk_ids": ranked[1:],
        }
        ok(client.post("/v1/feedback", json=feedback, headers=keys.reader), 201)

    runtime = runtime_of(client)
    monkeypatch.setenv("RAGSERVICE_DATABASE_URL", runtime.db.url)
    monkeypatch.setenv("RAGSERVICE_DATA_DIR", str(runtime.settings.database.data_dir))
    monkeypatch.setenv("RAGSERVICE_DEVICE", "cpu")
    get_settings.cache_clear()
    try:
        from ragservice.cli import app

        args = ["finetune", "--from-feedback", "--tenant", "acme", "--collection", "hr"]
        args += ["--base", str(tiny_path), "--out", "from-feedback", "--max-steps", "1"]
        args += ["--batch-size", "2", "--held-out", "0.25"]
        result = CliRunner().invoke(app, args, catch_exceptions=False)
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["model"]["name"] == "from-feedback"
    data = summary["data"]
    assert data["train_questions"] == 3 and data["held_out_questions"] == 1
    assert data["source"]["feedback"]["collection"] == "hr"
    with tenancy.as_system(), runtime.db.read() as session:
        row = store.embedding_models.get_model_by_name(session, "from-feedback")
    assert row is not None and row.active is False and row.dimension == 32
