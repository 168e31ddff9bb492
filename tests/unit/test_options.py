"""`retrieval.options`: one definition of a search — its defaults from the settings, the same
bounds in every interface, and a cache scope that no option can be left out of."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any

import annotated_types
import pytest

from ragservice.answering.answer_cache import answer_scope
from ragservice.answering.question import Question
from ragservice.api.schemas.answers import QueryRequest
from ragservice.api.schemas.search import Ranking, SearchRequest
from ragservice.config import LimitSettings, SearchSettings, Settings
from ragservice.errors import InvalidInputError
from ragservice.retrieval.filters import parse_and_compile
from ragservice.retrieval.fusion import Fusion
from ragservice.retrieval.options import DEFAULTS_FROM, Bounds, Mode, SearchOptions, bounds_of

# A value other than the default for every field of `SearchOptions`: a field added without one
# fails `test_every_field_is_covered` until it is listed here.
CHANGED: dict[str, Any] = {
    "mode": Mode.FULLTEXT,
    "k": 11,
    "filters": parse_and_compile({"year": 2020}),
    "ef_search": 77,
    "ef_search_defaults": (("float32", 55), ("halfvec", 100), ("binary", 40)),
    "rrf_k": 31,
    "dense_candidates": 101,
    "text_candidates": 99,
    "bm25_k1": 1.2,
    "bm25_b": 0.75,
    "bm25_postings_per_term": 500,
    "bm25_exact": False,
    "rescore_factor": 8,
    "fusion": Fusion.RRF,
    "text_weight": 0.3,
    "adaptive_weight": True,
    "prf": True,
    "prf_docs": 5,
    "prf_terms": 10,
    "prf_query_weight": 0.5,
    "group_documents": True,
    "document_share": 0.2,
}


def test_every_field_is_covered() -> None:
    assert set(CHANGED) == {f.name for f in dataclasses.fields(SearchOptions)}


@pytest.mark.parametrize("name", sorted(CHANGED))
def test_changing_any_field_changes_the_scope(name: str) -> None:
    base = SearchOptions()
    changed = dataclasses.replace(base, **{name: CHANGED[name]})
    assert changed.scope_parts("float32") != base.scope_parts("float32")
    question = Question(text="q", tenant_id=_TENANT, collection_ids=(), options=base)
    other = dataclasses.replace(question, options=changed)
    assert answer_scope(question, _Model(), {}) != answer_scope(other, _Model(), {})


def test_the_model_and_its_storage_are_part_of_the_scope() -> None:
    question = Question(text="q", tenant_id=_TENANT, collection_ids=(), options=SearchOptions())
    scope = answer_scope(question, _Model(), {})
    assert answer_scope(question, _Model(storage="halfvec"), {}) != scope
    assert answer_scope(question, _Model(id=2), {}) != scope
    assert answer_scope(question, _Model(), {"rerank": "x"}) != scope


def test_equal_filters_however_written_share_a_scope() -> None:
    one = parse_and_compile({"year": {"$gte": 2019, "$lt": 2022}, "chunk.lang": "en"})
    two = parse_and_compile({"chunk.lang": "en", "year": {"$lt": 2022, "$gte": 2019}})
    assert one is not None and two is not None
    assert one.key == two.key
    assert SearchOptions(filters=one).scope_parts("float32") == SearchOptions(
        filters=two
    ).scope_parts("float32")


def test_every_setting_change_reaches_the_options() -> None:
    """Each option's default is its setting's value: a setting left out of `from_settings`
    would not change the search (nor its cache scope)."""
    settings = Settings().search
    base = SearchOptions.from_settings(settings)
    for setting in DEFAULTS_FROM.values():
        value = _other_setting_value(settings, setting)
        changed = SearchOptions.from_settings(settings.model_copy(update={setting: value}))
        assert changed.scope_parts("float32") != base.scope_parts("float32"), setting


def test_overrides_are_checked_against_the_same_bounds() -> None:
    settings = Settings().search
    assert SearchOptions.from_settings(settings, rrf_k=1000).rrf_k == 1000
    with pytest.raises(InvalidInputError, match="rrf_k must be between 1 and 1000"):
        SearchOptions.from_settings(settings, rrf_k=1001)
    with pytest.raises(InvalidInputError, match="unknown search options: nope"):
        SearchOptions.from_settings(settings, nope=1)


NUMERIC = [o for o in DEFAULTS_FROM if bounds_of(o) != Bounds()]


@pytest.mark.parametrize("option", NUMERIC)
def test_the_options_take_their_settings_bounds(option: str) -> None:
    bounds = bounds_of(option)
    assert bounds.ge is not None, f"{option} is unbounded below"
    edges = [bounds.ge] if bounds.le is None else [bounds.ge, bounds.le]
    for edge in edges:
        SearchOptions(**{option: _typed(option, edge)})
    step = 1 if isinstance(_default(option), int) else 0.001
    outside = [bounds.ge - step] if bounds.le is None else [bounds.ge - step, bounds.le + step]
    for value in outside:
        with pytest.raises(InvalidInputError, match=option):
            SearchOptions(**{option: _typed(option, value)})


@pytest.mark.parametrize("option", sorted(Ranking.model_fields))
def test_the_rest_api_overrides_have_the_same_bounds(option: str) -> None:
    assert option in DEFAULTS_FROM
    metadata = Ranking.model_fields[option].metadata
    ge = next((m.ge for m in metadata if isinstance(m, annotated_types.Ge)), None)
    le = next((m.le for m in metadata if isinstance(m, annotated_types.Le)), None)
    assert Bounds(ge=ge, le=le) == bounds_of(option)


def test_k_and_mode_are_the_same_in_every_interface() -> None:
    from ragservice import client
    from ragservice.cli import query as cli
    from ragservice.mcp_server import server as mcp

    assert SearchRequest.model_fields["mode"].annotation is Mode
    assert QueryRequest.model_fields["mode"].annotation is Mode
    # The CLI declares a copy of the choices (its --help loads no retrieval module).
    assert [(m.name, m.value) for m in cli.Mode] == [(m.name, m.value) for m in Mode]
    # The MCP tools reach the service through its client, whose modes are these same values.
    assert set(typing.get_args(client.Mode)) == {m.value for m in Mode}
    # The lower bound of k: 1 in the options, the REST schema, the CLI and the MCP tool.
    with pytest.raises(InvalidInputError):
        SearchOptions(k=0)
    for request in (SearchRequest, QueryRequest):
        assert next(m.ge for m in request.model_fields["k"].metadata if hasattr(m, "ge")) == 1
    for command in (cli.search, cli.ask):
        hints = typing.get_type_hints(command, include_extras=True)
        assert typing.get_args(hints["k"])[1].min == 1
    source = inspect.getsource(mcp)
    assert "k: Annotated[int, Field(ge=1, le=TOOL_MAX_K" in source
    assert 1 <= mcp.TOOL_K <= mcp.TOOL_MAX_K <= LimitSettings().max_k  # at most the server's
    assert Settings().limits.max_k >= 50
    assert "        mode: Annotated[\n            Mode," in source


class _Model:
    def __init__(self, *, id: int = 1, storage: str = "float32") -> None:
        self.id = id
        self.dimension = 4
        self.storage = storage


_TENANT = __import__("uuid").UUID(int=1)


def _default(option: str) -> Any:
    return next(f.default for f in dataclasses.fields(SearchOptions) if f.name == option)


def _typed(option: str, value: float) -> Any:
    return int(value) if isinstance(_default(option), int) else float(value)


def _other_setting_value(settings: SearchSettings, setting: str) -> Any:
    value = getattr(settings, setting)
    field = SearchSettings.model_fields[setting]
    if isinstance(value, bool):
        return not value
    if setting == "hnsw_ef_search":
        return 42
    if isinstance(value, str):
        choices = typing.get_args(field.annotation)
        return next(choice for choice in choices if choice != value)
    bounds = bounds_of(next(o for o, s in DEFAULTS_FROM.items() if s == setting))
    if isinstance(value, int):
        return value + 1 if bounds.le is None or value + 1 <= bounds.le else value - 1
    return value / 2 if value else 0.5
