"""Principals and reader lists (`ragservice.readers`), and the folders' `.readers` sidecars
(`ingest.loaders.readers`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingest.loaders.readers import Sidecars, with_readers
from ragservice.db.tenancy import readers_setting
from ragservice.errors import InvalidInputError
from ragservice.readers import (
    MAX_READERS,
    array_literal,
    listable,
    parse_readers,
    principal_set,
)
from ragservice.types import LoadedDocument, LoadFailure


def test_reader_lists_are_checked_deduplicated_and_sorted() -> None:
    assert parse_readers(" user:ana , group:hr,user:ana") == ("group:hr", "user:ana")
    assert parse_readers(["group:a.b@c+d-e"]) == ("group:a.b@c+d-e",)
    assert parse_readers(None) is None
    assert parse_readers("") == () and parse_readers([]) == ()


@pytest.mark.parametrize(
    "bad",
    ["hr", "role:admin", "user:", "user:has space", 'group:"q"', "group:a,b}", "user:-x", "x" * 5],
)
def test_bad_principals_are_refused_with_the_form_to_use(bad: str) -> None:
    with pytest.raises(InvalidInputError) as refused:
        parse_readers([bad])
    assert "user:" in str(refused.value) or "letters" in str(refused.value)


def test_too_many_readers_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="use a group"):
        parse_readers([f"user:u{i}" for i in range(MAX_READERS + 1)])


def test_an_askers_principals_are_its_user_groups_and_key() -> None:
    ana = principal_set("ana", ["hr"])
    assert ana == frozenset({"user:ana", "group:hr"})
    assert principal_set(None, key_prefix="rsk_Ab-1_x") == frozenset({"key:rsk_Ab-1_x"})
    assert listable({"key:rsk_x", "user:ana", "group:hr"}) == ["group:hr", "user:ana"]


def test_the_transaction_setting_is_a_quoted_array_or_every_document() -> None:
    assert readers_setting(None) == "*"
    assert readers_setting(frozenset()) == "{}"
    assert array_literal({"user:ana", "group:hr"}) == '{"group:hr","user:ana"}'
    with pytest.raises(InvalidInputError):
        array_literal({'user:x"}'})


def test_the_nearest_sidecar_wins_up_to_the_walked_folder(tmp_path: Path) -> None:
    (tmp_path / "board" / "2027").mkdir(parents=True)
    (tmp_path / ".readers").write_text("# everyone in hr\ngroup:hr\n")
    (tmp_path / "board" / ".readers").write_text("group:board, user:ceo\n")
    sidecars = Sidecars()
    deep = tmp_path / "board" / "2027" / "minutes.md"
    assert sidecars.readers_for(deep, "board/2027/minutes.md") == ("group:board", "user:ceo")
    assert sidecars.readers_for(tmp_path / "a.md", "a.md") == ("group:hr",)
    # A file given directly: only its own folder's sidecar, nothing above.
    assert sidecars.readers_for(deep, "minutes.md") is None
    (tmp_path / "board" / "2027" / ".readers").write_text("")  # an empty one: the whole tenant
    assert Sidecars().readers_for(deep, "board/2027/minutes.md") == ()


def test_a_bad_sidecar_names_itself(tmp_path: Path) -> None:
    (tmp_path / ".readers").write_text("group:hr\neveryone\n")
    with pytest.raises(InvalidInputError, match=r"\.readers: reader 'everyone'"):
        Sidecars().readers_for(tmp_path / "a.md", "a.md")


def test_readers_go_to_the_documents_that_name_none() -> None:
    own = LoadedDocument(external_id="a", text="x", readers=("user:ana",))
    plain = LoadedDocument(external_id="b", text="y")
    failed = LoadFailure("c", "broken")
    given = list(with_readers([own, plain, failed], ("group:hr",)))
    assert [getattr(r, "readers", None) for r in given] == [("user:ana",), ("group:hr",), None]
    assert list(with_readers([plain], None)) == [plain]
