"""Prometheus metrics of one app: requests, pipeline stages, upstream errors, tokens.

Each app gets its own registry, so several apps in one process (tests) never collide.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

_LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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
            "locked_out: the client address made too many failed attempts).",
            ["reason"],
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

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)
