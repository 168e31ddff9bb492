"""The filter language: what parses, what is refused with which message, and what SQL it binds.

What the compiled SQL matches is checked against PostgreSQL in tests/integration/test_search.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from psycopg.types.json import Jsonb

from ragservice.errors import InvalidInputError
from ragservice.retrieval.filters import (
    MAX_CONDITIONS,
    MAX_IN_VALUES,
    CompiledFilter,
    Condition,
    Filter,
    Op,
    Scope,
    compile_filter,
    parse_and_compile,
    parse_filter,
)


def conditions(raw: object) -> list[tuple[Scope, str, Op, Any]]:
    return [(c.scope, c.field, c.op, c.value) for c in parse_filter(raw).conditions]


def compiled(raw: object) -> CompiledFilter:
    result = parse_and_compile(raw)
    assert result is not None
    return result


def rendered(raw: object) -> str:
    return compiled(raw).where.as_string(None)


def plain(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters with Jsonb wrappers opened, for comparison."""
    return {k: v.obj if isinstance(v, Jsonb) else v for k, v in params.items()}


# -- parsing ---------------------------------------------------------------------------------


def test_plain_value_is_equality_on_document_metadata() -> None:
    assert conditions({"year": 2020}) == [(Scope.DOCUMENT, "year", Op.EQ, 2020)]


def test_prefixes_choose_chunk_or_document_metadata() -> None:
    assert conditions({"chunk.lang": "en", "document.source": "pubmed"}) == [
        (Scope.CHUNK, "lang", Op.EQ, "en"),
        (Scope.DOCUMENT, "source", Op.EQ, "pubmed"),
    ]


def test_only_the_first_dot_splits_and_other_prefixes_are_part_of_the_name() -> None:
    assert conditions({"chunk.a.b": 1, "meta.x": 2}) == [
        (Scope.CHUNK, "a.b", Op.EQ, 1),
        (Scope.DOCUMENT, "meta.x", Op.EQ, 2),
    ]


def test_operators_on_one_field_and_together() -> None:
    assert conditions({"year": {"$gte": 2019, "$lt": 2022}}) == [
        (Scope.DOCUMENT, "year", Op.GTE, 2019),
        (Scope.DOCUMENT, "year", Op.LT, 2022),
    ]


def test_object_without_operators_is_a_value() -> None:
    assert conditions({"author": {"name": "Ada"}}) == [
        (Scope.DOCUMENT, "author", Op.EQ, {"name": "Ada"})
    ]


def test_every_operator_parses() -> None:
    raw = {
        "a": {"$eq": [1, 2]},
        "b": {"$ne": None},
        "c": {"$gt": 1.5, "$lte": "2024-01-01"},
        "d": {"$in": ["x", 2], "$nin": []},
        "e": {"$exists": False},
    }
    assert [c[2] for c in conditions(raw)] == [
        Op.EQ,
        Op.NE,
        Op.GT,
        Op.LTE,
        Op.IN,
        Op.NIN,
        Op.EXISTS,
    ]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([1, 2], "must be a JSON object"),
        ("year=2020", "must be a JSON object"),
        ({"": 1}, "non-empty strings"),
        ({"chunk.": 1}, "needs a name"),
        ({"x" * 300: 1}, "needs a name"),
        ({"$or": [{"a": 1}]}, "operators go inside a field"),
        ({"year": {"$regex": "x"}}, "unknown filter operator '\\$regex'"),
        ({"year": {}}, "empty condition object"),
        ({"year": {"$gt": 1, "month": 2}}, "cannot mix operators and plain keys"),
        ({"year": {"$gt": True}}, "takes a number or a string"),
        ({"year": {"$lt": None}}, "takes a number or a string"),
        ({"year": {"$gte": [2020]}}, "takes a number or a string"),
        ({"year": {"$in": 2020}}, "takes a list of values"),
        ({"year": {"$in": list(range(MAX_IN_VALUES + 1))}}, "at most"),
        ({"year": {"$exists": 1}}, "takes true or false"),
        ({"score": float("nan")}, "finite number"),
        ({"score": {"$gt": float("inf")}}, "finite number"),
        ({"when": object()}, "is not JSON"),
        ({"nested": {"ok": {1: "key is not a string"}}}, "is not JSON"),
    ],
)
def test_bad_filters_are_refused_with_a_clear_message(raw: object, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        parse_filter(raw)


def test_too_many_fields_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="more than"):
        parse_filter({f"f{i}": i for i in range(100)})


def test_in_values_are_limited_for_the_whole_filter_not_per_list() -> None:
    half = list(range(MAX_IN_VALUES // 2))
    fine = parse_filter({"a": {"$in": half}, "b": {"$nin": half}})
    assert sum(len(c.value) for c in fine.conditions) == MAX_IN_VALUES  # type: ignore[arg-type]
    # 64 lists of 1,000 each passed before: 64,000 arms of one SQL condition.
    flood = {f"f{i}": {"$in": list(range(MAX_IN_VALUES))} for i in range(2)}
    with pytest.raises(InvalidInputError, match=f"2000 .in/.nin values.*limit is {MAX_IN_VALUES}"):
        parse_filter(flood)


def test_conditions_are_counted_operator_by_operator() -> None:
    ranges = {"$gt": 1, "$gte": 1, "$lt": 9, "$lte": 9, "$ne": 5, "$exists": True}
    parse_filter({f"f{i}": ranges for i in range(MAX_CONDITIONS // 6)})
    with pytest.raises(InvalidInputError, match=f"66 conditions; the limit is {MAX_CONDITIONS}"):
        parse_filter({f"f{i}": ranges for i in range(11)})


# -- compiling -------------------------------------------------------------------------------


def test_nothing_to_compile_gives_none() -> None:
    assert parse_and_compile(None) is None
    assert parse_and_compile({}) is None
    assert compile_filter(Filter(())) is None


def test_equality_is_containment_with_the_pair_bound() -> None:
    result = compiled({"year": 2020})
    assert result.where.as_string(None) == "((d.metadata @> %(filter_0_0)s::jsonb))"
    assert plain(dict(result.params)) == {"filter_0_0": {"year": 2020}}
    assert result.needs_document


def test_chunk_fields_read_chunk_metadata_and_need_no_documents() -> None:
    result = compiled({"chunk.lang": "en"})
    assert "c.metadata @>" in result.where.as_string(None)
    assert not result.needs_document


def test_equality_with_an_array_also_compares_exactly() -> None:
    result = compiled({"tags": ["a", "b"]})
    assert "d.metadata -> %(filter_0_1)s = %(filter_0_2)s::jsonb" in result.where.as_string(None)
    assert plain(dict(result.params)) == {
        "filter_0_0": {"tags": ["a", "b"]},
        "filter_0_1": "tags",
        "filter_0_2": ["a", "b"],
    }


def test_ranges_check_the_json_type_of_the_field() -> None:
    number = rendered({"year": {"$gt": 2020}})
    assert "jsonb_typeof(d.metadata -> %(filter_0_0)s) = 'number'" in number
    assert "(d.metadata -> %(filter_0_0)s) > %(filter_0_1)s::jsonb" in number
    text = rendered({"date": {"$lte": "2024-05-01"}})
    assert "= 'string'" in text
    assert '(d.metadata ->> %(filter_0_0)s) COLLATE "C" <= %(filter_0_1)s::text' in text


def test_in_is_an_or_of_containments_and_nin_its_negation() -> None:
    assert rendered({"s": {"$in": ["a", "b"]}}) == (
        "(((d.metadata @> %(filter_0_0)s::jsonb) OR (d.metadata @> %(filter_0_1)s::jsonb)))"
    )
    assert rendered({"s": {"$nin": ["a"]}}) == (
        "((((d.metadata @> %(filter_0_0)s::jsonb)) IS NOT TRUE))"
    )
    assert rendered({"s": {"$in": []}}) == "(false)"


def test_exists_uses_the_key_operator() -> None:
    assert rendered({"s": {"$exists": True}}) == "((d.metadata ? %(filter_0_0)s))"
    assert rendered({"s": {"$exists": False}}) == "(((d.metadata ? %(filter_0_0)s) IS NOT TRUE))"


def test_field_names_and_values_never_reach_the_sql_text() -> None:
    evil = "x'); DROP TABLE chunks; --"
    raw = {evil: {"$gt": evil, "$exists": True}, f"chunk.{evil}": [evil]}
    result = compiled(raw)
    assert evil not in result.where.as_string(None)
    assert evil in result.params.values()


def test_conditions_get_distinct_parameter_names() -> None:
    result = compiled({"a": 1, "b": {"$in": [1, 2, 3]}, "c": {"$gte": 1, "$lte": 9}})
    names = result.params.keys()
    assert len(names) == 1 + 3 + 4
    assert all(name.startswith("filter_") for name in names)


def test_conditions_are_typed_values() -> None:
    flt = parse_filter({"chunk.page": {"$gte": 3}})
    assert flt.conditions == (Condition(Scope.CHUNK, "page", Op.GTE, 3),)
    assert flt.scopes == frozenset({Scope.CHUNK})
