"""One tenant's flood of answers does not push another tenant's requests into 504s.

Two upstream slots, each call held 0.25 s by the fake upstream, and a deadline of 1.5 s per
call (slot wait included). Tenant A keeps 14 requests going at once, so about a dozen of its
calls always wait for a slot. Served first come, first served (one queue, as before fair
shares; `test_fair_slots.py` shows that ordering), B's request would wait behind that dozen,
and they leave the queue only by being served (0.125 s each) or by timing out at their own
deadline, which comes before B's: B gets its slot at its deadline at best, and a 504. With
fair shares B holds no slot, so the next free one is B's: it waits one call at most.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from ragservice.config import Settings
from ragservice.limits import FairSlots
from tests.api.conftest import Keys
from tests.api.test_query import add_corpus
from tests.upstream import FakeOpenAI, slow

HOLD = 0.25  # seconds the upstream takes per call
DEADLINE = 1.5  # inference connect + read timeout: each call's deadline
FLOOD = 14  # tenant A's requests in flight at once


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        server.enqueue(*[slow(HOLD)] * 2000)
        yield server


@pytest.fixture
def api_settings(settings: Settings, fake: FakeOpenAI) -> Settings:
    return settings.model_copy(
        update={
            "job_poll_seconds": 0.2,
            "workers": 1,
            "inference_url": fake.base_url,
            "inference_connect_timeout": 0.5,
            "inference_read_timeout": DEADLINE - 0.5,
            "inference_max_retries": 0,
            "max_concurrent_upstream": 2,
            "max_concurrent_upstream_per_tenant": 2,  # no reserve: the queue order alone
            "rate_limit_per_second": 0.0,
            "cache_enabled": False,
        }
    )


@pytest.fixture
def two_tenants(client: TestClient, keys: Keys) -> Keys:
    add_corpus(client, keys.admin)
    add_corpus(client, keys.other_tenant)
    return keys


def upstream_slots(client: TestClient) -> FairSlots:
    slots: FairSlots = client.app.state.answers.pipeline._inference.slots  # type: ignore[attr-defined]
    return slots


def wait_for_queue(slots: FairSlots, at_least: int) -> None:
    deadline = time.monotonic() + 30
    while slots.waiting() < at_least:
        assert time.monotonic() < deadline, f"the flood never queued {at_least} calls"
        time.sleep(0.01)


QUESTION = {"question": "How long is parental leave?", "cache": False}


def test_a_flood_from_one_tenant_does_not_time_out_another(
    client: TestClient, two_tenants: Keys, fake: FakeOpenAI
) -> None:
    stop = threading.Event()
    statuses: list[int] = []

    def flood() -> None:
        while not stop.is_set():
            reply = client.post("/v1/query", json=QUESTION, headers=two_tenants.admin)
            statuses.append(reply.status_code)

    slots = upstream_slots(client)
    with ThreadPoolExecutor(max_workers=FLOOD) as pool:
        flooding = [pool.submit(flood) for _ in range(FLOOD)]
        try:
            replies = []
            for _ in range(3):
                wait_for_queue(slots, FLOOD - 4)  # A's calls are waiting: B comes behind them
                started = time.monotonic()
                reply = client.post("/v1/query", json=QUESTION, headers=two_tenants.other_tenant)
                replies.append((reply.status_code, time.monotonic() - started, reply.text))
        finally:
            stop.set()
            for future in flooding:
                future.result(timeout=60)

    assert [status for status, _, _ in replies] == [200, 200, 200], replies
    assert all(body and "upstream" not in body for _, _, body in replies)
    assert len(fake.chat_requests) > 3
    assert slots.in_use == 0 and slots.waiting() == 0
