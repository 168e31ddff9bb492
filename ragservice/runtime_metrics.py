"""What a process's metrics read from its runtime at scrape time (`runtime_collectors`): the
job queue, the embedding model's slots, the replicas, the embedded server's supervisor."""

from __future__ import annotations

from prometheus_client.registry import Collector

from ragservice import store
from ragservice.db import tenancy
from ragservice.metrics import (
    EmbeddedCollector,
    EmbeddingCollector,
    QueueCollector,
    ReplicaCollector,
)
from ragservice.runtime import Runtime


def runtime_collectors(runtime: Runtime) -> list[Collector]:
    """What a process's metrics read from its runtime at scrape time: the job queue (one
    count, cached a few seconds), the embedding model's slots, with replicas the read
    router's last checks, and with a supervised embedded server its supervisor's status."""
    db = runtime.db

    def queue_depth() -> tuple[int, int]:
        with tenancy.as_system(), db.read(primary=True) as session:
            return store.jobs.queue_depth(session)

    def embedding_slots() -> tuple[int, int]:
        return runtime.models.current().embedder.slot_use()

    collectors: list[Collector] = [QueueCollector(queue_depth), EmbeddingCollector(embedding_slots)]
    if db.router is not None:
        collectors.append(ReplicaCollector(db.router.status))
    supervisor = runtime.supervisor
    if supervisor is not None:
        collectors.append(EmbeddedCollector(lambda: supervisor.status().describe()))
    return collectors
