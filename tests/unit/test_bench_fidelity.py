"""`benchmarks/fidelity.py` and its peers' runner (`benchmarks/fidelity_peers.py`): the
runner's JSON lines, what counts as a rejected file, the measure modules' entry points and the
tables, without any of the peers' libraries (the project's environment has none of them)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests import corpus_pdf
from tests.unit.test_layering import ROOT

RUNNER = ROOT / "benchmarks" / "fidelity_peers.py"


def _load(name: str, file: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


fidelity = _load("bench_fidelity", "fidelity.py")
peers = _load("bench_fidelity_peers", "fidelity_peers.py")


def _runner(*args: str) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, str(RUNNER), *args], capture_output=True, text=True, check=True
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_the_runner_prints_a_pdfs_pages_and_a_failure_as_json_lines(tmp_path: Path) -> None:
    two_pages = tmp_path / "two.pdf"
    two_pages.write_bytes(corpus_pdf.long_table_pdf(80))
    missing = tmp_path / "missing.pdf"
    first, second = _runner("pypdfium2", str(two_pages), str(missing))
    assert first["file"] == str(two_pages)
    assert isinstance(first["pages"], list) and len(first["pages"]) >= 2
    assert "item 000" in first["pages"][0] and "item 079" in first["pages"][-1]
    assert isinstance(first["seconds"], float) and first["seconds"] >= 0
    assert second["file"] == str(missing) and "error" in second and "pages" not in second


def test_the_projects_environment_has_none_of_the_agpl_or_heavy_peers() -> None:
    (listed,) = _runner("--list")
    found = listed["peers"]
    assert isinstance(found, dict)
    for name in ("pymupdf", "pymupdf4llm", "markitdown", "unstructured"):
        assert "absent" in found[name], name
    assert "version" in found["pypdfium2"]
    assert listed["formats"]["pdftotext"] == [".pdf"]
    assert listed["formats"]["markitdown"] == ["*"]


def test_form_feeds_end_pages() -> None:
    assert peers.form_feed_pages("one\ftwo\f") == ["one", "two"]
    assert peers.form_feed_pages("one\ftwo") == ["one", "two"]


def test_a_file_the_runner_never_answered_is_rejected_with_the_reason() -> None:
    a, b = Path("/corpus/a.pdf"), Path("/corpus/b.pdf")
    stdout = 'noise from a library\n{"file": "/corpus/a.pdf", "pages": ["x"], "seconds": 0.5}\n'
    rows = fidelity.runner_lines(stdout, [a, b], "timed out after 60 s")
    assert rows[a]["pages"] == ["x"]
    assert rows[b] == {"file": "/corpus/b.pdf", "error": "timed out after 60 s"}


def test_a_measure_modules_entry_point_takes_an_optional_reader() -> None:
    module = ModuleType("tests.realdocs.fidelity.fake")

    def measure(name: str, read: object = None) -> None: ...
    def names() -> list[str]: ...
    def fidelity_of(read: object = None, names: object = None) -> None: ...

    for function in (measure, names, fidelity_of):
        function.__module__ = module.__name__
        setattr(module, function.__name__, function)
    assert fidelity.entry_point(module) is fidelity_of


def test_a_modules_result_splits_into_files_and_summary() -> None:
    files, summary = fidelity.split_result(([{"file": "a"}], {"recall": 0.5}))
    assert files == [{"file": "a"}] and summary == {"recall": 0.5}
    files, summary = fidelity.split_result({"files": [1], "summary": {"recall": 0.25}})
    assert files == [1] and summary == {"recall": 0.25}


def test_a_peers_rejected_files_and_seconds_come_from_its_own_rows() -> None:
    rows = {
        Path("/c/a.eml"): {"text": "hello", "seconds": 0.25},
        Path("/c/b.eml"): {"error": "ValueError: no"},
    }
    summary = fidelity.with_rates({"files": 2, "recall": 0.5, "seconds": 0.0}, [], rows)
    assert summary["rejected"] == 1 and summary["rejected_files"] == {"b.eml": "ValueError: no"}
    assert summary["seconds"] == 0.25 and summary["seconds_per_file"] == 0.125
    loader = fidelity.with_rates({"files": 4, "accepted": 3, "seconds": 2.0}, [], None)
    assert loader["rejected"] == 1 and loader["seconds_per_file"] == 0.5


def test_the_pdf_table_shows_each_reader_and_an_absent_peer() -> None:
    loader = {
        "recall": 0.9964,
        "precision": 0.99,
        "recall_pdfium": 0.98,
        "precision_pdfium": 0.97,
        "glued_runs": 2,
        "order_sentences": 10,
        "order_in_place": 7,
        "table_cells": 0,
        "table_cells_found": 0,
        "seconds_per_page": 0.0164,
        "rejected": 0,
    }
    readers = {"loader": loader, "unstructured": {"absent": "no model"}}
    table = fidelity.markdown_table("pdf", readers, {"loader": "the loader"}).splitlines()
    assert table[0].startswith("| reader | recall | precision |")
    assert table[1] == "|---|" + "---|" * 9
    assert table[2] == "| the loader | 0.996 | 0.990 | 0.980 | 0.970 | 2 | 7/10 | - | 0.0164 | 0 |"
    assert table[3].startswith("| unstructured | absent |")


def test_another_formats_table_shows_the_figures_its_module_reports() -> None:
    readers = {"loader": {"recall": 0.5, "precision": 1.0, "seconds_per_file": 0.1, "rejected": 1}}
    head, _, row = fidelity.markdown_table("mail", readers, {}).splitlines()
    assert head == "| reader | recall | precision | s/file | rejected |"
    assert row == "| loader | 0.500 | 1.000 | 0.1000 | 1 |"
    overall = fidelity.overall({"mail": readers, "pdf": {"loader": {"recall": 1.0, "files": 3}}})
    assert overall["loader"]["recall_mean"] == 0.75 and overall["loader"]["rejected"] == 1


def test_a_measure_module_not_there_yet_is_none() -> None:
    assert fidelity.measure_module("no_such_format") is None


def test_a_pdf_read_as_its_reference_scores_fully_and_a_failed_one_is_rejected() -> None:
    name = "elsarticle-elstest-5p.pdf"
    path = fidelity.pdf.PDF_FOLDER / name
    pages = fidelity.pdf.reference_pages(name)
    read = fidelity.measure_pdf("same", {path: {"pages": pages, "seconds": 0.4}})
    assert read["recall"] == 1.0 and read["rejected"] == 0 and read["glued_runs"] == 0
    assert read["seconds_per_page"] == round(0.4 / len(pages), 4)
    failed = fidelity.measure_pdf("broken", {path: {"error": "ValueError: no"}})
    assert failed["rejected"] == 1 and failed["rejected_files"] == {name: "ValueError: no"}
    assert failed["recall"] == 0.0 and failed["files"] == 1
    empty = fidelity.measure_pdf("silent", {path: {"pages": ["", " "], "seconds": 0.1}})
    assert empty["rejected_files"] == {name: "no text"}
