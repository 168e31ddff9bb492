"""`benchmarks/harness.py`: a BEIR corpus with empty documents is counted, reported and loaded
without them, against a fake API (no server)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from ragservice.client import RagserviceClient
from tests.unit.test_layering import ROOT


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("harness", ROOT / "benchmarks" / "harness.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["harness"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


harness = _load()

ROWS = [
    {"_id": "d1", "title": "A", "text": "Aspirin lowers stroke risk."},
    {"_id": "d2", "title": "Only a title", "text": ""},
    {"_id": "d3", "title": "", "text": "  \n\t "},
    {"_id": 4, "title": "", "text": "Numbers for ids."},
    {"_id": "d5", "title": "No text key"},
    {"_id": "d6", "title": "", "text": "\x00"},
]


def write_corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus.jsonl"
    lines = [json.dumps(row) for row in ROWS]
    corpus.write_text("\n".join(lines[:3]) + "\n\n" + "\n".join(lines[3:]) + "\n")
    return corpus


def test_the_census_counts_documents_and_names_the_empty_ones(tmp_path: Path) -> None:
    census = harness.corpus_census(write_corpus(tmp_path))
    assert census.documents == 2
    assert census.empty_ids == ["d2", "d3", "d5", "d6"]
    assert census.summary(shown=3) == {"count": 4, "ids": ["d2", "d3", "d5"]}


class FakeApi:
    """The endpoints `ensure_corpus` calls; the loader's behaviour: rows without text fail."""

    def __init__(self, stored: int | None) -> None:
        self.stored = stored  # None: no such collection yet
        self.uploads = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path, method = request.url.path, request.method
        if method == "GET" and path == "/v1/collections/beir":
            if self.stored is None:
                return httpx.Response(404, json={"detail": "not found"})
            return httpx.Response(200, json={"document_count": self.stored})
        if method == "POST" and path == "/v1/collections":
            self.stored = 0
            return httpx.Response(201, json={"name": "beir"})
        if method == "POST" and path == "/v1/collections/beir/documents/files":
            self.uploads += 1
            self.stored = 2
            return httpx.Response(202, json={"id": "job-1"})
        if method == "GET" and path == "/v1/jobs/job-1":
            errors: list[dict[str, Any]] = [{"reason": "no text could be extracted"}] * 4
            return httpx.Response(
                200, json={"status": "done", "counts": {"done": 2}, "errors": errors}
            )
        return httpx.Response(500, json={"detail": f"unexpected {method} {path}"})


def test_a_corpus_with_empty_documents_is_loaded_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api = FakeApi(stored=None)
    http = httpx.Client(base_url="http://bench", transport=httpx.MockTransport(api))
    with RagserviceClient(http) as client:
        census = harness.ensure_corpus(client, "beir", write_corpus(tmp_path))
        again = harness.ensure_corpus(client, "beir", write_corpus(tmp_path))
    assert (census.documents, census.empty_ids) == (2, ["d2", "d3", "d5", "d6"])
    assert again == census
    assert api.uploads == 1  # the second call found the collection complete
    err = capsys.readouterr().err
    assert "4 documents have no text and are left out (d2, d3, d5, d6)" in err
    assert "reusing 2 documents in 'beir'" in err


def test_documents_missing_for_another_reason_still_stop_the_benchmark(tmp_path: Path) -> None:
    api = FakeApi(stored=1)  # an earlier, partial load

    def lossy(request: httpx.Request) -> httpx.Response:
        response = api(request)
        if request.url.path.endswith("/files"):
            api.stored = 1  # one document with text went missing
        return response

    with (
        RagserviceClient(
            httpx.Client(base_url="http://bench", transport=httpx.MockTransport(lossy))
        ) as client,
        pytest.raises(SystemExit, match="expected 2 documents in 'beir', found 1"),
    ):
        harness.ensure_corpus(client, "beir", write_corpus(tmp_path))


@pytest.mark.parametrize("text", ["", " \n\t", "\x00\x1f", "\u3000\u2028", "x", " \x00a", "\ufeff"])
def test_blank_means_what_the_loader_cleans_away(text: str) -> None:
    from ingest.loaders.cleaning import clean_text

    assert bool(harness._BLANK.fullmatch(text)) == (not clean_text(text))


def test_memory_growth_runs_from_the_sample_nearest_the_minute_asked_to_the_last() -> None:
    Sample = harness.Sample
    samples = [
        Sample(0.0, {"api": 900.0, "worker-1": 500.0, "postgres": 300.0}),
        Sample(30.0, {"api": 950.0, "worker-1": 520.0, "postgres": 310.0}),
        Sample(61.0, {"api": 1000.0, "worker-1": 540.0, "postgres": 320.0}),
        Sample(90.0, {"api": 1010.0, "worker-1": 540.0, "postgres": None}),
        Sample(95.5, {"api": 1050.0, "worker-1": 567.0, "postgres": None}),
    ]
    cold = {"api": 800.0, "worker-1": 400.0, "postgres": 250.0}
    fields, lines = harness.memory_report(samples, cold, from_minutes=1)
    assert fields["rss_growth_after_warmup"] == {"api": 0.05, "worker-1": 0.05, "postgres": None}
    window = fields["rss_growth_window"]
    assert (window["from_minutes"], window["from_seconds"], window["to_seconds"]) == (1, 61.0, 95.5)
    assert window["start_mb"]["api"] == 1000.0 and window["end_mb"]["api"] == 1050.0
    # The API server's fields as before: the whole measured period.
    assert (fields["rss_start_mb"], fields["rss_end_mb"], fields["rss_growth_pct"]) == (
        900.0,
        1050.0,
        16.67,
    )
    assert fields["rss_series_by_process_mb"]["postgres"] == [300.0, 310.0, 320.0, None, None]
    assert fields["workers"] == 1
    assert lines[-1] == "growth from 61 s to 96 s: api +5.0%, worker-1 +5.0%, postgres -"
    assert harness.growth_percent(800.0, 880.0) == 10.0


def test_postgres_memory_is_read_from_the_process_its_postmaster_pid_names(
    tmp_path: Path,
) -> None:
    assert harness.postgres_mb(tmp_path) is None  # no postmaster.pid: not running
    (tmp_path / "postmaster.pid").write_text(f"{os.getpid()}\n{tmp_path}\n")
    measured = harness.postgres_mb(tmp_path)
    assert measured is not None and measured > 1
