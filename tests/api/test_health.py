"""Health endpoints through HTTP (in-process ASGI) against a real database: the public answers
are bare, the details are for admin keys, and /metrics may need a token or move to a port of
its own."""

from __future__ import annotations

import socket
from dataclasses import replace

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import create_engine

from ragservice.api.app import create_app
from ragservice.config import Settings
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from tests.api.conftest import Keys, ok, wait_for_job


def test_public_health_answers_are_bare_and_details_need_an_admin_key(
    client: TestClient, keys: Keys, embedder: SentenceTransformerEmbedder
) -> None:
    assert ok(client.get("/healthz")) == {"status": "ok"}
    assert ok(client.get("/readyz")) == {"status": "ok"}
    assert client.get("/v1/admin/health").status_code == 401
    assert client.get("/v1/admin/health", headers=keys.writer).status_code == 403
    assert ok(client.get("/v1/admin/health", headers=keys.admin)) == {
        "ready": True,
        "checks": {"database": True, "migrations": True, "model": True},
        "model": {
            "id": 1,
            "name": embedder.name,
            "version": 1,
            "dimension": 384,
            "storage": "float32",
            "precision": "float",
            "query_encoder": "onnx",
        },
    }
    paths = client.get("/openapi.json").json()["paths"]
    assert "/readyz" in paths and "/v1/admin/health" in paths


def test_readiness_reports_a_lost_database(client: TestClient, keys: Keys) -> None:
    state = client.app.state  # type: ignore[attr-defined]
    unreachable = create_engine("postgresql+psycopg://x@127.0.0.1:1/none")
    state.runtime = replace(state.runtime, db=replace(state.runtime.db, write_engine=unreachable))
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable"}
    details = client.get("/v1/admin/health", headers=keys.admin)
    assert details.status_code == 503
    assert details.json()["checks"]["database"] is False


def test_metrics_behind_a_token(settings: Settings, embedder: SentenceTransformerEmbedder) -> None:
    guarded = settings.model_copy(update={"metrics_token": SecretStr("s3cret-scrape")})
    with TestClient(create_app(guarded, embedder=embedder)) as client:
        refused = client.get("/metrics")
        assert refused.status_code == 401
        assert "RAGSERVICE_METRICS_TOKEN" in refused.json()["detail"]
        wrong = client.get("/metrics", headers={"Authorization": "Bearer s3cret-scrap"})
        assert wrong.status_code == 401
        scraped = client.get("/metrics", headers={"Authorization": "Bearer s3cret-scrape"})
        assert scraped.status_code == 200
        assert "ragservice_http_requests_total" in scraped.text


def test_metrics_on_a_port_of_their_own(
    settings: Settings, embedder: SentenceTransformerEmbedder
) -> None:
    port = _free_port()
    separate = settings.model_copy(update={"metrics_port": port})
    with TestClient(create_app(separate, embedder=embedder)) as client:
        assert client.get("/healthz").status_code == 200
        assert client.get("/metrics").status_code == 404
        scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert scraped.status_code == 200
        assert 'ragservice_http_requests_total{method="GET",route="/healthz",status="200"}' in (
            scraped.text
        )
    with pytest.raises(httpx.ConnectError):  # stopped with the app
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_metrics_show_the_process_the_jobs_and_the_queue(client: TestClient, keys: Keys) -> None:
    ok(client.post("/v1/collections", json={"name": "notes"}, headers=keys.writer), 201)
    documents = [{"external_id": "a", "text": "Alpha."}, {"external_id": "b", "text": "Beta."}]
    job = ok(
        client.post(
            "/v1/collections/notes/documents", json={"documents": documents}, headers=keys.writer
        ),
        202,
    )
    assert wait_for_job(client, job["id"], keys.writer)["status"] == "done"

    text = client.get("/metrics").text

    # The server's job threads count in the app's metrics.
    assert 'ragservice_jobs_claimed_total{kind="upload"} 1.0' in text
    assert 'ragservice_jobs_finished_total{kind="upload",outcome="done"} 1.0' in text
    assert 'ragservice_job_documents_total{result="new"} 2.0' in text
    assert "ragservice_jobs_running 0.0" in text
    assert "ragservice_ingest_queue_jobs 0.0" in text
    assert "ragservice_embedding_waiting 0.0" in text
    for name in ("process_resident_memory_bytes", "python_gc_objects_collected_total"):
        assert name in text
    assert "ragservice_replica_healthy" not in text  # no replicas configured
