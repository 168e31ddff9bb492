"""deploy/grafana/ragservice.json: a dashboard Grafana can import, and every metric its queries
name is one the service exports (the API's registry and `ragservice worker`'s), so the
dashboard cannot drift from the code."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from ragservice.metrics import (
    EmbeddingCollector,
    Metrics,
    QueueCollector,
    ReplicaCollector,
    WorkerMetrics,
)

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "ragservice.json"
# Metric names among PromQL's words: ours, and the process and Python collectors'.
_METRIC = re.compile(r"\b(?:ragservice|process|python)_[a-z0-9_]+\b")
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("_count", "_sum", "_created"),
    "info": ("_info",),
}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded = json.loads(DASHBOARD.read_text())
    assert isinstance(loaded, dict)
    return loaded


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # collapsed rows hold theirs
    return panels


def _expressions(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in _panels(dashboard) for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return exprs


def _exported(registry: CollectorRegistry) -> set[str]:
    """Every series name the registry's families can expose, with or without samples now."""
    names = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ()))
        names.update(sample.name for sample in family.samples)
    return names


def _service_metrics() -> set[str]:
    api, worker = Metrics(), WorkerMetrics()
    for metrics in (api, worker):
        metrics.watch(
            [
                QueueCollector(lambda: (0, 0)),
                EmbeddingCollector(lambda: (0, 0)),
                ReplicaCollector(lambda: []),
            ]
        )
    return _exported(api.registry) | _exported(worker.registry)


def test_the_dashboard_is_an_importable_model(dashboard: dict[str, Any]) -> None:
    assert dashboard["title"] and dashboard["uid"] and dashboard["schemaVersion"] >= 36
    inputs = {i["name"]: i for i in dashboard["__inputs"]}
    assert inputs["DS_PROMETHEUS"]["pluginId"] == "prometheus"
    panels = _panels(dashboard)
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        assert panel["targets"], panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


def test_every_metric_the_dashboard_queries_is_exported(dashboard: dict[str, Any]) -> None:
    exported = _service_metrics()
    used = {name for expr in _expressions(dashboard) for name in _METRIC.findall(expr)}
    assert used - exported == set()
    # What operators asked for is on it.
    for name in (
        "ragservice_http_request_seconds_bucket",
        "ragservice_jobs_finished_total",
        "ragservice_job_documents_total",
        "ragservice_ingest_queue_jobs",
        "ragservice_replica_lag_seconds",
        "ragservice_replica_healthy",
        "process_cpu_seconds_total",
        "python_gc_collections_total",
    ):
        assert name in used
