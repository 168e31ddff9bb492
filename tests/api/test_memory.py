"""Memory under traffic: 900 requests in process leave the traced heap flat.

The soak (benchmarks/soak.py) found the API server growing by some 7 KB a request: every new
database connection registered pgvector's types with new classes that psycopg never frees, and
a pool that overflows under load opens connections all the time (db/vector_types.py). Here the
pools are emptied every few requests, so that new connections are opened as under load (or
after a restart of PostgreSQL), and the Python heap, traced by `tracemalloc` after a warm-up,
must stay within a bound that the old code exceeded several times over.
"""

from __future__ import annotations

import gc
import itertools
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ragservice.config import Settings
from tests.api.conftest import Keys, ok
from tests.api.test_query import add_corpus

WARM_UP = 100
MEASURED = 800
EMPTY_POOLS_EVERY = 8  # requests: each then opens new connections
# What the heap may gain over the measured requests. The old code gained about 22 KB for each
# new connection, some 8 MB here (9.8 MB in 1,000 requests); the fixed code about 150 KB.
BOUND_BYTES = 1_000_000


@pytest.fixture
def api_settings(api_settings: Settings) -> Settings:
    """No rate limit: the requests come as fast as the machine makes them."""
    return api_settings.model_copy(update={"rate_limit_per_second": 0})


def test_900_requests_leave_the_traced_heap_flat(client: TestClient, keys: Keys) -> None:
    add_corpus(client, keys.writer)
    answer = ok(client.post("/v1/query", json={"question": "parental leave"}, headers=keys.reader))
    requests = _traffic(answer["query_id"])
    engines = client.app.state.runtime.db.engines()  # type: ignore[attr-defined]

    def run(count: int) -> None:
        for number in range(count):
            method, path, body = next(requests)
            response = client.request(method, path, json=body, headers=keys.reader)
            assert response.status_code < 300, response.text
            if number % EMPTY_POOLS_EVERY == 0:
                for engine in engines:
                    engine.dispose()  # pooled connections closed: the next request opens one

    run(WARM_UP)
    gc.collect()
    tracemalloc.start()  # from here on: what is still allocated at the end was kept
    try:
        run(MEASURED)
        gc.collect()
        gained = tracemalloc.get_traced_memory()[0]
        kept = tracemalloc.take_snapshot().statistics("lineno")
    finally:
        tracemalloc.stop()
    top = "\n".join(str(stat) for stat in kept[:10])
    assert gained < BOUND_BYTES, f"the heap gained {gained} bytes in {MEASURED} requests:\n{top}"


def _traffic(query_id: str) -> Iterator[tuple[str, str, dict[str, Any] | None]]:
    """Reads and writes of each kind the soak makes, over and over: (method, path, body)."""
    search = {"query": "weeks of paid leave", "collections": ["hr"], "k": 3}
    question = {"question": "how long is parental leave", "collections": ["hr"]}
    return itertools.cycle(
        [
            ("POST", "/v1/search", {**search, "mode": "fulltext"}),
            ("POST", "/v1/search", {**search, "mode": "dense"}),
            ("GET", "/v1/collections/hr", None),
            ("POST", "/v1/query", question),
            ("POST", "/v1/feedback", {"query_id": query_id, "rating": 1}),
        ]
    )
