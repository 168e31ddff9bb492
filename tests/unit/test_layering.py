"""The dependency direction of the layout: leaves stay leaves, nothing imports the top layers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def internal(path: Path) -> set[str]:
    return {n for n in imports_of(path) if n.split(".")[0] in ("ragservice", "ingest")}


def service_modules() -> list[Path]:
    return [
        p
        for p in (ROOT / "ragservice").rglob("*.py")
        if not {"api", "cli"} & set(p.relative_to(ROOT / "ragservice").parts)
    ]


@pytest.mark.parametrize("path", service_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_below_the_top_imports_api_cli_or_ingest(path: Path) -> None:
    top = {
        n for n in internal(path) if n.startswith(("ragservice.api", "ragservice.cli", "ingest"))
    }
    assert top == set()


@pytest.mark.parametrize("leaf", ["config.py", "errors.py", "types.py"])
def test_leaves_import_nothing_internal(leaf: str) -> None:
    assert internal(ROOT / "ragservice" / leaf) == set()


@pytest.mark.parametrize(
    "adapter",
    [
        "chunking.py",
        "answering/context.py",
        "embedding/embedder.py",
        "answering/inference.py",
        "answering/prompt.py",
        "retrieval/rerank.py",
    ],
)
def test_adapters_never_touch_the_database(adapter: str) -> None:
    found = {
        n
        for n in internal(ROOT / "ragservice" / adapter)
        if n.startswith(("ragservice.db", "ragservice.store"))
    }
    assert found == set()


def test_sql_on_documents_lives_in_the_store() -> None:
    """No module outside the db layer and store.py writes SQL against the core tables."""
    allowed = {ROOT / "ragservice" / "retrieval" / "search.py"}
    offenders = []
    for path in [*service_modules(), *(ROOT / "ingest").rglob("*.py")]:
        if path in allowed or {"db", "store"} & set(path.relative_to(ROOT).parts):
            continue
        source = path.read_text()
        if any(
            f"FROM {table}" in source or f"INTO {table}" in source
            for table in ("documents", "chunks", "chunk_embeddings")
        ):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


@pytest.mark.parametrize(
    "path",
    # `python -m ingest` is an entry point, a composition root like the CLI it starts.
    sorted(p for p in (ROOT / "ingest").rglob("*.py") if p.name != "__main__.py"),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_ingest_does_not_import_the_api_or_cli(path: Path) -> None:
    assert {
        n for n in internal(path) if n.startswith(("ragservice.api", "ragservice.cli"))
    } == set()
