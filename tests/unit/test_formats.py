"""The one list of formats (`ingest.loaders.formats`) and what is derived from it."""

from __future__ import annotations

from pathlib import Path

from ingest.loaders.formats import (
    FORMATS,
    SUFFIX_OF_MEDIA_TYPE,
    SUPPORTED_SUFFIXES,
    file_type,
    format_table,
)
from ingest.loaders.sandbox import PARSERS
from ingest.loaders.walking import walk_files
from ragservice.extras import EXTRA_MODULES

ROOT = Path(__file__).resolve().parents[2]
# Read apart from the sandbox's parsers: each yields many documents.
READ_APART = {"jsonl", "parquet"}
PPTX_TYPE = "application/vnd.openxmlformats-officedocument.presentationml.presentation"


def test_the_docs_table_is_the_registrys() -> None:
    """docs/ingest.md holds `format_table()` as it is: regenerate it when a format changes."""
    assert format_table() in (ROOT / "docs" / "ingest.md").read_text()


def test_every_suffix_picks_one_format_by_its_own_name() -> None:
    assert len(SUPPORTED_SUFFIXES) == len(set(SUPPORTED_SUFFIXES))
    assert all(s.startswith(".") and s == s.lower() for s in SUPPORTED_SUFFIXES)
    assert len({f.kind for f in FORMATS}) == len(FORMATS)
    assert file_type("Deck.PPTX") == ".pptx"
    assert file_type("archive.zip") == file_type(".txt") == file_type("README") == ""


def test_the_sandbox_parses_every_format_but_those_read_apart() -> None:
    parsed = {f.kind for f in FORMATS} - READ_APART
    assert {kind for kind, _ in PARSERS.values()} == parsed
    assert set(PARSERS) == {s for f in FORMATS if f.kind in parsed for s in f.suffixes}


def test_every_extra_named_is_one_of_the_installs() -> None:
    assert {f.extra for f in FORMATS if f.extra} <= set(EXTRA_MODULES)
    assert all(f.mime_types and f.read_with and f.text for f in FORMATS)


def test_the_walker_takes_every_registered_suffix_and_skips_others(tmp_path: Path) -> None:
    names = [f"file{i}{suffix}" for i, suffix in enumerate(SUPPORTED_SUFFIXES)]
    for name in [*names, "notes.ods"]:
        (tmp_path / name).write_bytes(b"x")
    skipped = {e.path.name: e.skipped for e in walk_files([tmp_path], (), ())}
    assert {name for name, why in skipped.items() if not why} == set(names)
    assert skipped["notes.ods"] == "unsupported file type .ods"


def test_a_media_type_names_a_file_by_its_subtype_where_one_matches() -> None:
    assert SUFFIX_OF_MEDIA_TYPE["image/tiff"] == ".tiff"
    assert SUFFIX_OF_MEDIA_TYPE["image/jpeg"] == ".jpeg"
    assert SUFFIX_OF_MEDIA_TYPE["application/xhtml+xml"] == ".html"
    assert SUFFIX_OF_MEDIA_TYPE[PPTX_TYPE] == ".pptx"
    assert all(file_type(f"x{suffix}") for suffix in SUFFIX_OF_MEDIA_TYPE.values())
