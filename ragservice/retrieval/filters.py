"""Metadata filters: parse the JSON filter language, compile it to a bound SQL fragment.

The language, by example::

    {"year": 2020}                                  equality shorthand (document metadata)
    {"year": {"$gte": 2019, "$lt": 2022}}           operators on one field AND together
    {"chunk.lang": "en", "document.source": {"$in": ["pubmed", "arxiv"]}}

`chunk.NAME` addresses the chunk's metadata, `document.NAME` or a plain `NAME` the document's.
NAME is one top-level key, taken literally (it may contain further dots). Several keys AND
together. Operators: `$eq $ne $gt $gte $lt $lte $in $nin $exists`.

- Equality is exact: `{"tags": ["a"]}` matches only that array. It compiles to jsonb containment
  (`metadata @> {"NAME": value}`) so the GIN index on documents.metadata can answer it.
- Ranges take a number or a string and match only fields of that JSON type; strings compare by
  code point, so ISO dates order as dates. A field of another type simply does not match.
- `$ne` and `$nin` match rows where the field is missing, as `$exists: false` does.

Pure: imports no database code. The compiled fragment refers to chunks as `c` and documents as
`d`, and every name and value in it is a bound parameter.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from ragservice.errors import InvalidInputError
from ragservice.limits import MAX_JSON_DEPTH, too_deep

JSONValue = None | bool | int | float | str | list[Any] | dict[str, Any]

MAX_CONDITIONS = 64
"""Conditions in one filter, counting each operator of a field (`{"$gte": 1, "$lt": 9}`: 2)."""
MAX_IN_VALUES = 1000
"""`$in` and `$nin` values in one filter, all of its lists together: each is an arm of the SQL."""
MAX_FIELD_CHARS = 256


class Scope(StrEnum):
    CHUNK = "chunk"
    DOCUMENT = "document"


class Op(StrEnum):
    EQ = "$eq"
    NE = "$ne"
    GT = "$gt"
    GTE = "$gte"
    LT = "$lt"
    LTE = "$lte"
    IN = "$in"
    NIN = "$nin"
    EXISTS = "$exists"


_RANGE_SQL = {Op.GT: ">", Op.GTE: ">=", Op.LT: "<", Op.LTE: "<="}
_LISTS = (Op.IN, Op.NIN)


@dataclass(frozen=True, slots=True)
class Condition:
    """One test on one metadata field; `value` is already checked against the operator."""

    scope: Scope
    field: str
    op: Op
    value: JSONValue


@dataclass(frozen=True, slots=True)
class Filter:
    """Conditions that all must hold."""

    conditions: tuple[Condition, ...]

    @property
    def scopes(self) -> frozenset[Scope]:
        return frozenset(c.scope for c in self.conditions)


@dataclass(frozen=True, slots=True)
class CompiledFilter:
    """A WHERE fragment over `c` (chunks) and `d` (documents) with its named parameters, and
    the filter it was compiled from."""

    where: sql.Composable
    params: Mapping[str, Any]
    needs_document: bool
    source: Filter

    @property
    def key(self) -> str:
        """The filter as canonical JSON: equal filters, however written, have equal keys (a
        part of the answer cache's scope)."""
        conditions = sorted(
            ([str(c.scope), c.field, str(c.op), c.value] for c in self.source.conditions),
            key=lambda row: json.dumps(row, sort_keys=True),
        )
        return json.dumps(conditions, sort_keys=True, separators=(",", ":"))


# -- parsing ---------------------------------------------------------------------------------


def parse_filter(raw: object) -> Filter:
    """Check a decoded JSON filter object and turn it into a typed `Filter`."""
    if not isinstance(raw, Mapping):
        raise InvalidInputError("filter must be a JSON object of field names to conditions")
    if len(raw) > MAX_CONDITIONS:
        raise InvalidInputError(f"filter has more than {MAX_CONDITIONS} fields")
    if too_deep(raw):  # before `_json_value` recurses into it
        raise InvalidInputError(f"filter is nested deeper than {MAX_JSON_DEPTH} levels")
    conditions: list[Condition] = []
    for key, spec in raw.items():
        scope, name = _parse_field(key)
        conditions.extend(_parse_conditions(scope, name, key, spec))
        _check_size(conditions)  # as it grows: a filter far over the limits is not all parsed
    return Filter(tuple(conditions))


def _check_size(conditions: Sequence[Condition]) -> None:
    """The filter as a whole within `MAX_CONDITIONS` and `MAX_IN_VALUES` (each list is also
    checked on its own as it is parsed)."""
    if len(conditions) > MAX_CONDITIONS:
        raise InvalidInputError(
            f"filter has {len(conditions)} conditions; the limit is {MAX_CONDITIONS}"
        )
    values = sum(len(c.value) for c in conditions if isinstance(c.value, list) and c.op in _LISTS)
    if values > MAX_IN_VALUES:
        raise InvalidInputError(
            f"filter has {values} $in/$nin values in all; the limit is {MAX_IN_VALUES} "
            "for the whole filter"
        )


def _parse_field(key: object) -> tuple[Scope, str]:
    if not isinstance(key, str) or not key:
        raise InvalidInputError("filter field names must be non-empty strings")
    if key.startswith("$"):
        raise InvalidInputError(
            f"unknown filter field {key!r}: operators go inside a field, e.g. "
            '{"year": {"$gte": 2020}}'
        )
    scope, name = Scope.DOCUMENT, key
    prefix, dot, rest = key.partition(".")
    if dot and prefix in (Scope.CHUNK, Scope.DOCUMENT):
        scope, name = Scope(prefix), rest
    if not name or len(name) > MAX_FIELD_CHARS:
        raise InvalidInputError(
            f"filter field {key!r} needs a name of 1 to {MAX_FIELD_CHARS} characters"
        )
    return scope, name


def _parse_conditions(scope: Scope, name: str, key: str, spec: object) -> list[Condition]:
    if not _is_operator_object(spec):
        return [Condition(scope, name, Op.EQ, _json_value(key, spec))]
    assert isinstance(spec, Mapping)
    if not spec:
        raise InvalidInputError(f"filter field {key!r} has an empty condition object")
    return [Condition(scope, name, *_parse_operator(key, op, value)) for op, value in spec.items()]


def _is_operator_object(spec: object) -> bool:
    """An object whose keys all start with `$` holds operators; one with none is a value."""
    if not isinstance(spec, Mapping):
        return False
    kinds = {isinstance(k, str) and k.startswith("$") for k in spec}
    if kinds == {True, False}:
        raise InvalidInputError("a filter condition cannot mix operators and plain keys")
    return kinds != {False}  # an empty object counts as operators, and is refused as such


def _parse_operator(key: str, op_name: object, value: object) -> tuple[Op, JSONValue]:
    try:
        op = Op(str(op_name))
    except ValueError:
        known = ", ".join(o.value for o in Op)
        raise InvalidInputError(
            f"unknown filter operator {op_name!r} on {key!r}; known: {known}"
        ) from None
    if op in _RANGE_SQL:
        return op, _range_value(key, op, value)
    if op in (Op.IN, Op.NIN):
        return op, _in_values(key, op, value)
    if op is Op.EXISTS:
        if not isinstance(value, bool):
            raise InvalidInputError(f"{op} on {key!r} takes true or false")
        return op, value
    return op, _json_value(key, value)


def _range_value(key: str, op: Op, value: object) -> JSONValue:
    # bool is an int in Python, but true > 3 means nothing in a filter.
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidInputError(f"{op} on {key!r} takes a number or a string")
    return _json_value(key, value)


def _in_values(key: str, op: Op, value: object) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidInputError(f"{op} on {key!r} takes a list of values")
    if len(value) > MAX_IN_VALUES:
        raise InvalidInputError(f"{op} on {key!r} takes at most {MAX_IN_VALUES} values")
    return [_json_value(key, v) for v in value]


def _json_value(key: str, value: object) -> JSONValue:
    """The value itself, once it is known to be plain, finite JSON."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInputError(f"filter value for {key!r} must be a finite number")
        return value
    if isinstance(value, list):
        return [_json_value(key, v) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: _json_value(key, v) for k, v in value.items()}
    raise InvalidInputError(f"filter value for {key!r} is not JSON: {type(value).__name__}")


# -- compiling -------------------------------------------------------------------------------


def compile_filter(flt: Filter) -> CompiledFilter | None:
    """The SQL of a filter; None when it has no conditions (nothing to restrict)."""
    if not flt.conditions:
        return None
    params: dict[str, Any] = {}
    parts = [_compile_condition(cond, _Namer(params, i)) for i, cond in enumerate(flt.conditions)]
    return CompiledFilter(
        where=sql.SQL("({})").format(sql.SQL(" AND ").join(parts)),
        params=params,
        needs_document=Scope.DOCUMENT in flt.scopes,
        source=flt,
    )


def parse_and_compile(raw: object) -> CompiledFilter | None:
    """`compile_filter(parse_filter(raw))`; None for a missing or empty filter."""
    return None if raw is None else compile_filter(parse_filter(raw))


class _Namer:
    """Hands out parameter placeholders unique to one condition (`filter_3_0`, ...)."""

    def __init__(self, params: dict[str, Any], index: int) -> None:
        self._params = params
        self._prefix = f"filter_{index}_"
        self._count = 0

    def bind(self, value: Any) -> sql.Placeholder:
        name = f"{self._prefix}{self._count}"
        self._count += 1
        self._params[name] = value
        return sql.Placeholder(name)


def _compile_condition(cond: Condition, namer: _Namer) -> sql.Composable:
    column = sql.SQL("c.metadata" if cond.scope is Scope.CHUNK else "d.metadata")
    if cond.op is Op.EQ:
        return _equals(column, cond.field, cond.value, namer)
    if cond.op is Op.NE:
        return _negate(_equals(column, cond.field, cond.value, namer))
    if cond.op in _RANGE_SQL:
        return _range(column, cond.field, cond.op, cond.value, namer)
    if cond.op in (Op.IN, Op.NIN):
        assert isinstance(cond.value, list)
        found = _any_of(column, cond.field, cond.value, namer)
        return found if cond.op is Op.IN else _negate(found)
    exists = sql.SQL("({} ? {})").format(column, namer.bind(cond.field))
    return exists if cond.value else _negate(exists)


def _equals(column: sql.SQL, field: str, value: JSONValue, namer: _Namer) -> sql.Composable:
    contains = sql.SQL("{} @> {}::jsonb").format(column, namer.bind(Jsonb({field: value})))
    if not isinstance(value, list | dict):
        return sql.SQL("({})").format(contains)
    # Containment of arrays and objects is not equality ([1, 2] contains [1]): containment
    # still lets the index narrow the rows, the exact comparison decides.
    exact = sql.SQL("{} -> {} = {}::jsonb").format(
        column, namer.bind(field), namer.bind(Jsonb(value))
    )
    return sql.SQL("({} AND {})").format(contains, exact)


def _range(column: sql.SQL, field: str, op: Op, value: JSONValue, namer: _Namer) -> sql.Composable:
    operator = sql.SQL(_RANGE_SQL[op])
    name = namer.bind(field)
    if isinstance(value, str):
        # COLLATE "C": code-point order whatever the database's collation, which is what
        # makes ISO 8601 dates and times compare correctly as strings.
        return sql.SQL(
            "(jsonb_typeof({c} -> {n}) = 'string' AND ({c} ->> {n}) COLLATE \"C\" {o} {v}::text)"
        ).format(c=column, n=name, o=operator, v=namer.bind(value))
    # jsonb comparison never raises across types; the type test keeps booleans, which sort
    # above numbers in jsonb order, from matching `$gt`.
    return sql.SQL("(jsonb_typeof({c} -> {n}) = 'number' AND ({c} -> {n}) {o} {v}::jsonb)").format(
        c=column, n=name, o=operator, v=namer.bind(Jsonb(value))
    )


def _any_of(
    column: sql.SQL, field: str, values: Sequence[JSONValue], namer: _Namer
) -> sql.Composable:
    if not values:
        return sql.SQL("false")
    # An OR of containments, not `= ANY(...)`: the GIN index serves each arm (a BitmapOr).
    return sql.SQL("({})").format(
        sql.SQL(" OR ").join(_equals(column, field, v, namer) for v in values)
    )


def _negate(condition: sql.Composable) -> sql.Composable:
    # IS NOT TRUE: a comparison on a missing field yields NULL, and `$ne` must match it.
    return sql.SQL("({} IS NOT TRUE)").format(condition)
