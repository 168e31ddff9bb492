"""Prometheus metrics of one process: the API's requests, pipeline stages, upstream errors and
tokens; ingest jobs; and, read at scrape time, replicas, the job queue, the embedding model and
the embedded PostgreSQL's supervisor.

Each app (and each `ragservice worker`) gets its own registry, so several apps in one process
(tests) never collide. Process, garbage-collector and platform collectors are on every registry.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

_LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_JOB_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600)

QUEUE_CACHE_SECONDS = 5.0
"""A scrape within this long of the last reuses its job queue count instead of asking again."""


def process_registry() -> CollectorRegistry:
    """A registry of its own with the process (CPU, memory, file descriptors), garbage
    collector and platform (Python version) collectors on it."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    GCCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


class JobMetrics:
    """Ingest jobs run by this process's workers (the server's threads or `ragservice worker`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.claimed = Counter(
            "ragservice_jobs_claimed",
            "Ingest jobs this process's workers claimed from the queue, by job kind "
            "(upload, import, ...).",
            ["kind"],
            registry=registry,
        )
        self.finished = Counter(
            "ragservice_jobs_finished",
            "Ingest job attempts that ended, by job kind and outcome: done, failed, queued (the "
            "worker stopped and put it back), lost (taken over or deleted meanwhile), stalled "
            "(the database went away; taken over once its heartbeat is stale).",
            ["kind", "outcome"],
            registry=registry,
        )
        self.running = Gauge(
            "ragservice_jobs_running",
            "Ingest jobs this process's workers are running now.",
            registry=registry,
        )
        self.seconds = Histogram(
            "ragservice_job_seconds",
            "Time from claiming an ingest job to its end, by job kind and outcome.",
            ["kind", "outcome"],
            buckets=_JOB_BUCKETS,
            registry=registry,
        )
        self.documents = Counter(
            "ragservice_job_documents",
            "Documents ingest jobs processed, by result (new, updated, unchanged, failed; and "
            "files skipped, of a type no loader reads); rate() of it is the documents per "
            "second. Counted as jobs make progress.",
            ["result"],
            registry=registry,
        )
        self.chunks_embedded = Counter(
            "ragservice_job_chunks_embedded",
            "Chunks ingest jobs embedded (chunks reused or imported with vectors left out).",
            registry=registry,
        )

    def add_progress(self, delta: Mapping[str, int]) -> None:
        """Count what a job processed since it was last counted (`IngestReport.counts` keys)."""
        for result in ("new", "updated", "unchanged", "failed", "skipped"):
            if delta.get(result):
                self.documents.labels(result=result).inc(delta[result])
        if delta.get("chunks_embedded"):
            self.chunks_embedded.inc(delta["chunks_embedded"])

    def finished_job(self, kind: str, outcome: str, seconds: float) -> None:
        self.finished.labels(kind=kind, outcome=outcome).inc()
        self.seconds.labels(kind=kind, outcome=outcome).observe(seconds)


class _Registered:
    """A registry that scrape-time collectors are added to and taken off again."""

    registry: CollectorRegistry

    def watch(self, collectors: Iterable[Collector]) -> Callable[[], None]:
        """Register `collectors`; returns what unregisters them (when their source closes)."""
        added = list(collectors)
        for collector in added:
            self.registry.register(collector)

        def unwatch() -> None:
            for collector in added:
                self.registry.unregister(collector)

        return unwatch

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)

    def serve(self, host: str, port: int) -> Callable[[], None]:
        """Serve the metrics over HTTP on `host:port` (any path) from a thread; returns what
        stops the server."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        log.info("serving metrics on %s:%d", host, server.server_port)

        def stop() -> None:
            server.shutdown()
            server.server_close()
            thread.join(5.0)

        return stop


class WorkerMetrics(_Registered):
    """The metrics of a `ragservice worker` process: its jobs and the process itself."""

    def __init__(self) -> None:
        self.registry = process_registry()
        self.jobs = JobMetrics(self.registry)


class Metrics(_Registered):
    """The metrics of one API app: requests, the answering pipeline, and its job threads."""

    def __init__(self) -> None:
        self.registry = process_registry()
        self.jobs = JobMetrics(self.registry)
        self.requests = Counter(
            "ragservice_http_requests",
            "HTTP requests by route template, method and status code.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "ragservice_http_request_seconds",
            "HTTP request latency by route template.",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.stage_seconds = Histogram(
            "ragservice_pipeline_stage_seconds",
            "Time per stage of answering a question (embed, search, rerank, context, generate).",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "ragservice_upstream_errors",
            "Failed calls to the inference layer, by kind (timeout, error).",
            ["kind"],
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "ragservice_rate_limited_requests",
            "Requests refused with 429 because their API key was over its rate limit.",
            registry=self.registry,
        )
        self.auth_refused = Counter(
            "ragservice_auth_refused_requests",
            "Requests refused before their route ran, by reason (missing, unknown, expired, "
            "locked_out: the client address made too many failed attempts; token: a signed "
            "token refused).",
            ["reason"],
            registry=self.registry,
        )
        self.query_log_failures = Counter(
            "ragservice_query_log_write_failures",
            "Answered questions whose query log row could not be written (logged as errors, "
            "by query id); any is worth an alert.",
            registry=self.registry,
        )
        self.tokens_generated = Counter(
            "ragservice_tokens_generated",
            "Completion tokens the inference layer generated.",
            registry=self.registry,
        )

        self.cache_lookups = Counter(
            "ragservice_cache_lookups",
            "Prompt cache lookups by result (exact_hit, semantic_hit, miss).",
            ["result"],
            registry=self.registry,
        )
        self.cache_guard_refusals = Counter(
            "ragservice_cache_guard_refusals",
            "Near matches the meaning guard turned away, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.cache_lookup_seconds = Histogram(
            "ragservice_cache_lookup_seconds",
            "Time to look a prompt up in the cache (the query embedding left out).",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(route=route, method=method, status=str(status)).inc()
        self.request_seconds.labels(route=route).observe(seconds)

    def observe_stages(self, timings_ms: Mapping[str, float]) -> None:
        for stage, ms in timings_ms.items():
            self.stage_seconds.labels(stage=stage).observe(ms / 1000)


# -- read at scrape time -------------------------------------------------------------------------


class ReplicaCollector(Collector):
    """Replica lag, health and routing from the read router's last checks (no query at scrape).

    `nodes` returns every node as `ReadRouter.status` does: dicts with `name`, `role`
    (primary, replica), `region`, `healthy`, `serving` (replicas), `lag_seconds`, `lag_bytes`
    and `reads`.
    """

    def __init__(self, nodes: Callable[[], Iterable[Mapping[str, Any]]]) -> None:
        self._nodes = nodes

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        lag_seconds, lag_bytes, healthy, serving, reads = families
        for node in self._nodes():
            name = str(node["name"])
            if node.get("role") == "primary":
                reads.add_metric([name], float(node.get("reads") or 0))
                continue
            labels = [name, str(node.get("region") or "")]
            healthy.add_metric(labels, 1.0 if node.get("healthy") else 0.0)
            serving.add_metric(labels, 1.0 if node.get("serving") else 0.0)
            if node.get("lag_seconds") is not None:
                lag_seconds.add_metric(labels, float(node["lag_seconds"]))
            if node.get("lag_bytes") is not None:
                lag_bytes.add_metric(labels, float(node["lag_bytes"]))
            reads.add_metric([name], float(node.get("reads") or 0))
        return families

    @staticmethod
    def _families() -> tuple[
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        CounterMetricFamily,
    ]:
        labels = ["replica", "region"]
        return (
            GaugeMetricFamily(
                "ragservice_replica_lag_seconds",
                "How far a read replica is behind the primary, in seconds, at the last check "
                "(absent while it cannot be checked).",
                labels=labels,
            ),
            GaugeMetricFamily(
                "ragservice_replica_lag_bytes",
                "WAL bytes a read replica has yet to replay, at the last check.",
                labels=labels,
            ),
            GaugeMetricFamily(
                "ragservice_replica_healthy",
                "1 when a read replica answered its last check as a standby, else 0.",
                labels=labels,
            ),
            GaugeMetricFamily(
                "ragservice_replica_serving",
                "1 when a read replica takes reads now (healthy and within "
                "RAGSERVICE_REPLICA_MAX_LAG_SECONDS), else 0.",
                labels=labels,
            ),
            CounterMetricFamily(
                "ragservice_db_reads",
                "Reads the router sent to each node (primary or a replica's name).",
                labels=["node"],
            ),
        )


class QueueCollector(Collector):
    """The ingest job queue in the database: jobs waiting for a worker and their files and
    texts. `depth` runs one count (jobs, items); its answer is kept `max_age` seconds, so
    frequent or concurrent scrapes cost one query at most that often. A failed count leaves
    the two gauges out of that scrape."""

    def __init__(
        self,
        depth: Callable[[], tuple[int, int]],
        *,
        max_age: float = QUEUE_CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._depth = depth
        self._max_age = max_age
        self._clock = clock
        self._lock = threading.Lock()
        self._last: tuple[float, tuple[int, int] | None] | None = None

    def describe(self) -> Iterable[Metric]:
        return list(self._families(None))

    def collect(self) -> Iterable[Metric]:
        return self._families(self._current())

    def _current(self) -> tuple[int, int] | None:
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last[0] < self._max_age:
                return self._last[1]
            try:
                value: tuple[int, int] | None = self._depth()
            except Exception as exc:  # a scrape must not fail over the database
                log.warning("counting the job queue for metrics failed: %s", exc)
                value = None
            self._last = (now, value)
            return value

    @staticmethod
    def _families(depth: tuple[int, int] | None) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(
            "ragservice_ingest_queue_jobs",
            "The embedding queue: ingest jobs (uploads, imports) queued in the database and "
            "waiting for a worker to claim them, all tenants together.",
        )
        items = GaugeMetricFamily(
            "ragservice_ingest_queue_items",
            "Files and texts of the queued ingest jobs (ragservice_ingest_queue_jobs), "
            "waiting to be loaded, chunked and embedded.",
        )
        if depth is not None:
            jobs.add_metric([], float(depth[0]))
            items.add_metric([], float(depth[1]))
        yield jobs
        yield items


class EmbeddingCollector(Collector):
    """The embedding model's computations in this process: running and waiting for one of its
    `RAGSERVICE_MAX_CONCURRENT_EMBEDDINGS` slots. `slots` returns (running, waiting)."""

    def __init__(self, slots: Callable[[], tuple[int, int]]) -> None:
        self._slots = slots

    def describe(self) -> Iterable[Metric]:
        return list(self._families(0, 0))

    def collect(self) -> Iterable[Metric]:
        running, waiting = self._slots()
        return self._families(running, waiting)

    @staticmethod
    def _families(running: int, waiting: int) -> list[Metric]:
        return [
            GaugeMetricFamily(
                "ragservice_embedding_running",
                "Embedding model computations (a query, or a batch of texts of ingest or "
                "/v1/embeddings) running now in this process.",
                value=float(running),
            ),
            GaugeMetricFamily(
                "ragservice_embedding_waiting",
                "Embedding model computations waiting for a free slot "
                "(RAGSERVICE_MAX_CONCURRENT_EMBEDDINGS) in this process.",
                value=float(waiting),
            ),
        ]


class EmbeddedCollector(Collector):
    """The embedded PostgreSQL's supervisor in this process: whether the server is up, how
    often it was seen gone and started again, and the wait before the next attempt. `status`
    returns the supervisor's status as a dict (`SupervisorStatus.describe()`)."""

    def __init__(self, status: Callable[[], Mapping[str, Any]]) -> None:
        self._status = status

    def describe(self) -> Iterable[Metric]:
        return self._families({})

    def collect(self) -> Iterable[Metric]:
        return self._families(self._status())

    @staticmethod
    def _families(status: Mapping[str, Any]) -> list[Metric]:
        return [
            GaugeMetricFamily(
                "ragservice_embedded_postgres_up",
                "1 while the embedded PostgreSQL is running and ready, else 0 (gone, being "
                "started again, or in crash recovery).",
                value=1.0 if status.get("state") == "running" else 0.0,
            ),
            CounterMetricFamily(
                "ragservice_embedded_postgres_exits",
                "Times this process saw the embedded PostgreSQL gone (killed, crashed, stopped).",
                value=float(status.get("exits") or 0),
            ),
            CounterMetricFamily(
                "ragservice_embedded_postgres_restarts",
                "Times this process started the embedded PostgreSQL again after it exited.",
                value=float(status.get("restarts") or 0),
            ),
            CounterMetricFamily(
                "ragservice_embedded_postgres_restart_failures",
                "Attempts to start the embedded PostgreSQL again that failed (retried with "
                "back-off).",
                value=float(status.get("restart_failures") or 0),
            ),
            GaugeMetricFamily(
                "ragservice_embedded_postgres_backoff_seconds",
                "Seconds until the next attempt to start the embedded PostgreSQL (0 when none "
                "is waiting).",
                value=float(status.get("next_attempt_in_seconds") or 0.0),
            ),
        ]
