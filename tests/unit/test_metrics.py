"""Metrics read at scrape time, from their sources' state: replicas from the read router's last
checks, the job queue count (cached, failures left out), the embedding model's slots; and the
process collectors on every registry."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine

from ragservice.db.routing import PRIMARY, Health, ReadRouter, Replica
from ragservice.metrics import (
    EmbeddingCollector,
    Metrics,
    QueueCollector,
    ReplicaCollector,
    WorkerMetrics,
)


def test_replica_gauges_come_from_the_routers_last_checks() -> None:
    engine = create_engine("postgresql+psycopg://x@127.0.0.1:1/none")  # never connected
    nodes = [("eu-1", "eu"), ("us-1", "us"), ("us-2", "us")]
    current, behind, down = (Replica(name, region, engine) for name, region in nodes)
    router = ReadRouter(
        engine,
        [current, behind, down],
        region="eu",
        max_lag_seconds=5.0,
        wait_seconds=0.1,
        check_seconds=1.0,
        check_timeout=1.0,
    )
    now = datetime.now(UTC)
    current.health = Health(healthy=True, checked_at=now, lsn=100, lag_bytes=0, lag_seconds=0.2)
    behind.health = Health(healthy=True, checked_at=now, lsn=10, lag_bytes=90, lag_seconds=42.0)
    down.health = Health(healthy=False, checked_at=now, error="connection refused")
    for node in ["eu-1", "eu-1", PRIMARY]:
        router.count_read(node)
    metrics = Metrics()
    metrics.watch([ReplicaCollector(router.status)])
    sample = metrics.registry.get_sample_value

    eu, us, us2 = ({"replica": n, "region": n[:2]} for n in ("eu-1", "us-1", "us-2"))
    assert sample("ragservice_replica_lag_seconds", eu) == pytest.approx(0.2)
    assert sample("ragservice_replica_lag_seconds", us) == 42.0
    assert sample("ragservice_replica_lag_seconds", us2) is None  # not known: left out
    assert sample("ragservice_replica_lag_bytes", us) == 90
    assert [sample("ragservice_replica_healthy", n) for n in (eu, us, us2)] == [1, 1, 0]
    assert [sample("ragservice_replica_serving", n) for n in (eu, us, us2)] == [1, 0, 0]
    assert sample("ragservice_db_reads_total", {"node": "eu-1"}) == 2
    assert sample("ragservice_db_reads_total", {"node": PRIMARY}) == 1
    assert sample("ragservice_db_reads_total", {"node": "us-1"}) == 0


def test_the_queue_count_is_cached_and_a_failed_count_is_left_out() -> None:
    answers: list[tuple[int, int] | Exception] = [(3, 12), RuntimeError("db down"), (0, 0)]
    asked: list[int] = []
    clock = [100.0]

    def depth() -> tuple[int, int]:
        asked.append(1)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    metrics = WorkerMetrics()
    metrics.watch([QueueCollector(depth, max_age=5.0, clock=lambda: clock[0])])
    sample = metrics.registry.get_sample_value

    assert (sample("ragservice_ingest_queue_jobs"), sample("ragservice_ingest_queue_items")) == (
        3,
        12,
    )
    clock[0] += 4.9
    assert sample("ragservice_ingest_queue_jobs") == 3  # within max_age: no second query
    assert len(asked) == 1
    clock[0] += 0.2
    assert sample("ragservice_ingest_queue_jobs") is None  # the count failed: no sample
    assert b"ragservice_ingest_queue_items" in metrics.exposition()  # the scrape still works
    clock[0] += 5.0
    assert sample("ragservice_ingest_queue_jobs") == 0
    assert len(asked) == 3


def test_embedding_slots_and_process_collectors() -> None:
    metrics = WorkerMetrics()
    metrics.watch([EmbeddingCollector(lambda: (2, 5))])
    text = metrics.exposition().decode()
    assert "ragservice_embedding_running 2.0" in text
    assert "ragservice_embedding_waiting 5.0" in text
    for name in ("process_cpu_seconds_total", "python_gc_collections_total", "python_info"):
        assert name in text
    # Registries of their own: two apps in one process never collide.
    assert Metrics().registry is not Metrics().registry
