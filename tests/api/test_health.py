"""Health endpoints through HTTP (in-process ASGI) against a real database."""

from __future__ import annotations

from dataclasses import replace

from fastapi.testclient import TestClient
from sqlalchemy import create_engine

from ragservice.api.app import create_app
from ragservice.config import Settings
from ragservice.embedding.embedder import SentenceTransformerEmbedder


def test_healthz_and_readyz(settings: Settings, embedder: SentenceTransformerEmbedder) -> None:
    with TestClient(create_app(settings, embedder=embedder)) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        ready = client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json() == {
            "ready": True,
            "checks": {"database": True, "migrations": True, "model": True},
            "model": {"id": 1, "name": embedder.name, "version": 1, "dimension": 384},
        }
        assert "/readyz" in client.get("/openapi.json").json()["paths"]


def test_readyz_reports_a_lost_database(
    settings: Settings, embedder: SentenceTransformerEmbedder
) -> None:
    with TestClient(create_app(settings, embedder=embedder)) as client:
        state = client.app.state  # type: ignore[attr-defined]
        unreachable = create_engine("postgresql+psycopg://x@127.0.0.1:1/none")
        state.runtime = replace(
            state.runtime, db=replace(state.runtime.db, write_engine=unreachable)
        )
        response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["database"] is False
