"""Row-level security behind the API: a lookup that forgets its tenant filter still finds
nothing of another tenant's, because each request's transactions name the caller's tenant."""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from ragservice import store
from ragservice.db.models import Collection
from tests.api.conftest import Keys, ok, wait_for_job


def _find_collection_forgetting_the_tenant(
    session: Session, _tenant_id: uuid.UUID, name: str
) -> uuid.UUID | None:
    """`store.collections.find_collection_id` with the bug of filtering by name only."""
    return session.scalar(select(Collection.id).where(Collection.name == name))


def test_a_forgotten_tenant_filter_still_shows_no_foreign_rows(
    client: TestClient, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    ok(client.post("/v1/collections", json={"name": "secret"}, headers=keys.admin), 201)
    job = ok(
        client.post(
            "/v1/collections/secret/documents",
            json={"documents": [{"external_id": "plan", "text": "The merger closes in March."}]},
            headers=keys.writer,
        ),
        202,
    )
    assert wait_for_job(client, job["id"], keys.writer)["status"] == "done"
    monkeypatch.setattr(
        store.collections, "find_collection_id", _find_collection_forgetting_the_tenant
    )

    # The owner still finds its collection through the buggy lookup ...
    own = ok(
        client.post(
            "/v1/search", json={"query": "merger", "collections": ["secret"]}, headers=keys.reader
        )
    )
    assert [hit["document"]["external_id"] for hit in own["results"]] == ["plan"]
    # ... and another tenant does not: the database showed its transaction no such row.
    search = client.post(
        "/v1/search",
        json={"query": "merger", "collections": ["secret"]},
        headers=keys.other_tenant,
    )
    assert search.status_code == 404, search.text
    listed = client.get("/v1/collections/secret/documents", headers=keys.other_tenant)
    assert listed.status_code == 404, listed.text
