"""The code reads settings by group (`settings.search.bm25_k1`): `Settings` holds the groups
alone, and no module (benchmarks included, which mypy does not check) reads a setting flat."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from ragservice.config import FLAT_NAMES, GROUPS

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("ragservice", "ingest", "benchmarks")
SETTINGS_TYPES = {"Settings", "Settings | None", "'Settings'", "Settings | None = None"}
SETTINGS_CALLS = {"Settings", "get_settings"}
FIELDS = set(FLAT_NAMES) | {name for group in GROUPS.values() for name in group.model_fields}


def _is_settings_call(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name | ast.Attribute)
        and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr) in SETTINGS_CALLS
    )


class FlatReads(ast.NodeVisitor):
    """`<settings>.<field>` where `<settings>` is a `Settings`: a name annotated so, or assigned
    `Settings(...)` or `get_settings()`, or named `settings` where nothing says otherwise; an
    attribute `.settings` (`runtime.settings`); a call of `Settings` or `get_settings`."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []
        self.scopes: list[dict[str, bool]] = [{}]

    def _is_settings(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            for scope in reversed(self.scopes):
                if node.id in scope:
                    return scope[node.id]
            return node.id in ("settings", "_settings")
        if isinstance(node, ast.Attribute):
            return node.attr in ("settings", "_settings")
        return _is_settings_call(node)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        self.scopes.append(
            {
                arg.arg: arg.annotation is not None
                and ast.unparse(arg.annotation) in SETTINGS_TYPES
                for arg in arguments
                if arg.annotation is not None
            }
        )
        self.generic_visit(node)
        self.scopes.pop()

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_Assign(self, node: ast.Assign) -> None:
        if _is_settings_call(node.value):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.scopes[-1][target.id] = True
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in FIELDS and self._is_settings(node.value):
            self.found.append((node.lineno, ast.unparse(node)))
        self.generic_visit(node)


def flat_reads(source: str) -> list[tuple[int, str]]:
    visitor = FlatReads()
    visitor.visit(ast.parse(source))
    return visitor.found


def _modules() -> Iterator[Path]:
    for folder in FOLDERS:
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_no_module_reads_a_setting_flat() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text}"
        for path in _modules()
        for line, text in flat_reads(path.read_text())
    ]
    assert found == []


def test_the_scan_sees_flat_reads() -> None:
    source = """
settings = get_settings()
settings.data_dir
get_settings().max_k
def f(runtime, config: Settings, search: SearchSettings, settings: SourceSettings):
    runtime.settings.cache_enabled
    config.bm25_k1
    search.bm25_k1
    settings.crawl_depth
    settings.sources.crawl_depth
"""
    assert [text for _, text in flat_reads(source)] == [
        "settings.data_dir",
        "get_settings().max_k",
        "runtime.settings.cache_enabled",
        "config.bm25_k1",
    ]
