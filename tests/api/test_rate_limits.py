"""Limits over HTTP: the per-key rate limit (429 + Retry-After) and the batch size limit."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from fastapi.testclient import TestClient

from ragservice.api.app import create_app
from ragservice.config import Settings
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from ragservice.limits.rate_limits import RateLimiter
from tests.api.conftest import Keys, ok

BURST = 3


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    # A token a second: a burst of requests runs out at once, and a second later one works.
    return settings.model_copy(
        update={"rate_limit_per_second": 1.0, "rate_limit_burst": BURST, "max_batch_items": 2}
    )


@dataclass
class ManualClock:
    """Time that moves only when a test moves it: a slow machine refills no bucket."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def clock(client: TestClient) -> Iterator[ManualClock]:
    manual = ManualClock()
    limiter = RateLimiter(per_second=1.0, burst=BURST, clock=manual)
    client.app.state.rate_limiter = limiter  # type: ignore[attr-defined]
    yield manual


def refused(response: httpx.Response) -> dict[str, object]:
    assert response.status_code == 429, response.text
    body: dict[str, object] = response.json()
    assert set(body) == {"error", "detail", "request_id"}
    assert body["error"] == "RateLimited"
    assert body["request_id"] == response.headers["x-request-id"]
    return body


def test_a_key_over_its_burst_gets_429_with_retry_after_then_works_again(
    client: TestClient, keys: Keys, clock: ManualClock
) -> None:
    for _ in range(BURST):
        ok(client.get("/v1/collections", headers=keys.reader))
    over = client.get("/v1/collections", headers=keys.reader)
    body = refused(over)
    assert "rate limit of 1 requests per second (bursts of 3)" in str(body["detail"])
    retry_after = int(over.headers["retry-after"])
    assert retry_after == 1  # under a second to the next token, rounded up to whole seconds

    # Other keys, of the same tenant or another, have buckets of their own.
    ok(client.get("/v1/collections", headers=keys.writer))
    ok(client.get("/v1/collections", headers=keys.other_tenant))

    clock.now += retry_after
    ok(client.get("/v1/collections", headers=keys.reader))


def test_every_route_of_a_key_draws_on_one_bucket_and_refusals_are_counted(
    client: TestClient, keys: Keys
) -> None:
    ok(client.post("/v1/collections", json={"name": "kb"}, headers=keys.admin), 201)
    ok(client.get("/v1/collections/kb", headers=keys.admin))
    ok(client.get("/v1/jobs", headers=keys.admin))
    refused(client.get("/v1/models", headers=keys.admin))
    refused(client.delete("/v1/collections/kb", headers=keys.admin))  # nothing deleted
    metrics = client.get("/metrics").text
    assert "ragservice_rate_limited_requests_total 2.0" in metrics
    assert 'status="429"' in metrics
    ok(client.get("/v1/collections/kb", headers=keys.reader))


def test_requests_without_a_key_are_not_rate_limited(client: TestClient) -> None:
    for _ in range(BURST + 2):
        assert client.get("/v1/collections").status_code == 401


def test_auth_disabled_means_no_rate_limit(
    api_settings: Settings, embedder: SentenceTransformerEmbedder
) -> None:
    off = api_settings.model_copy(update={"auth_disabled": True, "rate_limit_burst": 1})
    with TestClient(create_app(off, embedder=embedder)) as client:
        for _ in range(5):
            ok(client.get("/v1/collections"))


def test_a_rate_of_zero_turns_the_limit_off(
    client: TestClient, keys: Keys, api_settings: Settings
) -> None:
    off = api_settings.model_copy(update={"rate_limit_per_second": 0.0})
    client.app.state.rate_limiter = RateLimiter.from_settings(off.security)  # type: ignore[attr-defined]
    for _ in range(BURST + 2):
        ok(client.get("/v1/collections", headers=keys.reader))


def test_batches_over_max_batch_items_are_413_naming_the_setting(
    client: TestClient, keys: Keys
) -> None:
    ok(client.post("/v1/collections", json={"name": "kb"}, headers=keys.writer), 201)
    documents = [{"external_id": f"d{i}", "text": f"text {i}"} for i in range(3)]
    too_many = client.post(
        "/v1/collections/kb/documents", json={"documents": documents}, headers=keys.writer
    )
    assert too_many.status_code == 413, too_many.text
    assert too_many.json()["error"] == "PayloadTooLarge"
    assert "3 items" in too_many.json()["detail"]
    assert "RAGSERVICE_MAX_BATCH_ITEMS" in too_many.json()["detail"]
    assert ok(client.get("/v1/jobs", headers=keys.reader))["jobs"] == []  # nothing queued

    embeddings = client.post(
        "/v1/embeddings", json={"input": ["a", "b", "c"]}, headers=keys.other_tenant
    )
    assert embeddings.status_code == 413, embeddings.text
    assert "RAGSERVICE_MAX_BATCH_ITEMS" in embeddings.json()["detail"]

    ok(  # the writer's third request: refused batches count against the key too
        client.post(
            "/v1/collections/kb/documents", json={"documents": documents[:2]}, headers=keys.writer
        ),
        202,
    )
    vectors = ok(client.post("/v1/embeddings", json={"input": ["a", "b"]}, headers=keys.admin))
    assert len(vectors["data"]) == 2


def test_an_answer_costs_more_than_a_read_and_at_most_the_burst(
    client: TestClient, keys: Keys
) -> None:
    ok(client.post("/v1/collections", json={"name": "kb"}, headers=keys.writer), 201)
    question = {"question": "anything", "collections": ["kb"]}
    ok(client.post("/v1/query", json=question, headers=keys.reader))  # 4, capped at the burst: 3
    refused(client.get("/v1/collections", headers=keys.reader))  # nothing left

    ok(client.get("/v1/collections", headers=keys.admin))  # 1 of 3: 2 left, an answer needs 3
    body = refused(client.post("/v1/query", json=question, headers=keys.admin))
    assert "an answer costs 3 rate-limit tokens" in str(body["detail"])
