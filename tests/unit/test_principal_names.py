"""Names checked by a pattern match the whole text: a trailing newline (which a `$` anchor lets
through) or any other character outside the pattern is refused, wherever a name comes in."""

from __future__ import annotations

import pytest

from ragservice.api.middleware import _request_id
from ragservice.embedding import finetune
from ragservice.errors import InvalidInputError
from ragservice.readers import (
    check_name,
    may_read,
    parse_principal,
    parse_readers,
    principal,
    principal_set,
)

BAD = ["ana\n", "ana\r", "ana\n\n", "\nana", "ana\nbob", "ana ", "", "-ana"]


@pytest.mark.parametrize("name", BAD)
def test_check_name_refuses_a_name_with_anything_around_it(name: str) -> None:
    with pytest.raises(InvalidInputError):
        check_name(name, "user")


@pytest.mark.parametrize("name", ["ana", "a", "ana.b@example.com", "x+y_z-1", "A" * 128])
def test_check_name_keeps_a_good_name_as_given(name: str) -> None:
    assert check_name(name) == name


def test_a_name_over_128_characters_is_refused() -> None:
    with pytest.raises(InvalidInputError):
        check_name("A" * 129)


@pytest.mark.parametrize("kind", ["user", "group"])
def test_principals_refuse_a_trailing_newline(kind: str) -> None:
    with pytest.raises(InvalidInputError):
        principal(kind, "hr\n")
    with pytest.raises(InvalidInputError):
        principal_set("ana\n") if kind == "user" else principal_set("ana", ["hr\n"])


def test_reader_lists_strip_spaces_around_but_refuse_a_newline_inside() -> None:
    assert parse_principal(" group:hr ") == "group:hr"
    assert parse_readers("group:hr,user:ana\n") == ("group:hr", "user:ana")
    with pytest.raises(InvalidInputError):
        parse_principal("group:h\nr")
    with pytest.raises(InvalidInputError):
        parse_readers(["user:ana\nbob"])


def test_a_token_user_or_group_with_a_trailing_newline_is_refused() -> None:
    """The API makes a token's principal set with `principal_set`: a claim `ana\\n` must not
    become `user:ana\\n`."""
    with pytest.raises(InvalidInputError):
        principal_set("ana\n", ["hr"])
    with pytest.raises(InvalidInputError):
        principal_set("ana", ["hr\n"])


@pytest.mark.parametrize("name", ["model\n", "model\nx", "model "])
def test_model_names_refuse_a_trailing_newline(name: str) -> None:
    with pytest.raises(InvalidInputError):
        finetune.check_name(name)
    assert finetune.check_name("model-1.2_x") == "model-1.2_x"


def test_a_request_id_with_a_trailing_newline_is_replaced() -> None:
    def scope(value: bytes) -> dict[str, object]:
        return {"headers": [(b"x-request-id", value)]}

    assert _request_id(scope(b"abc-1")) == "abc-1"  # type: ignore[arg-type]
    assert _request_id(scope(b"abc-1\n")) != "abc-1\n"  # type: ignore[arg-type]


def test_may_read_follows_the_policies() -> None:
    """Every document for None; an open document (no list, or an empty one) for any set; a
    restricted one for a set sharing a principal with its list."""
    assert may_read(None, ["group:hr"])
    assert may_read(frozenset(), None) and may_read(frozenset(), [])
    assert may_read(frozenset({"user:ana", "group:hr"}), ["group:hr"])
    assert not may_read(frozenset({"user:bob"}), ["group:hr", "user:ana"])
    assert not may_read(frozenset(), ["user:ana"])
