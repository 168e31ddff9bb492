"""The real office documents of the corpus (tests/realdocs/office: DOCX, PPTX, ODT, RTF that
nobody here wrote) through the real loaders: each is accepted, gives the words its library
reads from it (`tests.realdocs.fidelity.office`), and a deck's words land on their slides."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

from ingest.loaders import DocumentLimits, load_file
from ragservice.types import LoadedDocument
from tests.realdocs.fidelity.office import (
    Loaded,
    OfficeFidelity,
    load,
    measure,
    measure_all,
    reference_text,
)
from tests.realdocs.sources import ROOT, sources

OFFICE = [source.name for source in sources(("office",))]
RECALL = 0.95
# Where the loader gives less than RECALL of the library's words, on purpose.
FLOORS = {
    # The table of contents (a generated index that repeats the headings, left out so that a
    # question about a chapter finds the chapter, not its entry in the index) is 597 of the
    # 12,338 words odfpy reads from the manual (4.8%): the loader gives 0.9516.
    "aprx-manual.odt": 0.95,
}


@cache
def fidelity(name: str) -> OfficeFidelity:
    return measure(ROOT / "office" / name)


@cache
def loaded(name: str) -> Loaded:
    return load(ROOT / "office" / name)


def test_the_corpus_has_each_format() -> None:
    suffixes = {Path(name).suffix for name in OFFICE}
    assert suffixes == {".docx", ".pptx", ".odt", ".rtf"}


@pytest.mark.parametrize("name", OFFICE)
def test_each_file_is_accepted_with_the_words_its_library_reads(name: str) -> None:
    result = fidelity(name)
    assert result.accepted, result.refused
    assert result.score.recall >= FLOORS.get(name, RECALL), result.as_json()
    assert result.score.precision >= 0.9, result.as_json()


@pytest.mark.parametrize("name", [n for n in OFFICE if n.endswith(".pptx")])
def test_every_word_of_a_slide_is_on_that_slide(name: str) -> None:
    result = fidelity(name)
    assert result.place_score is not None and result.place_score.recall == 1.0, result.as_json()


@pytest.mark.parametrize("name", OFFICE)
def test_each_file_loads_through_the_sandbox(name: str) -> None:
    limits = DocumentLimits(max_pages=2000, max_chars=5_000_000, parse_seconds=60)
    [result] = list(load_file(ROOT / "office" / name, name, limits=limits))
    assert isinstance(result, LoadedDocument), result


def test_docx_headers_and_footers_are_read_once_around_the_body() -> None:
    text = loaded("officer-example.docx").text
    assert text.startswith("a bookmark is here\n\n# Title 1")  # the header
    assert text.endswith("another bookmark is here")  # the footer
    pages = loaded("python-docx-sct-first-page-hdrftr.docx").text
    assert pages.count("First Page Header (section 2)") == 1


def test_a_docx_whose_only_words_are_its_header_and_footer_is_accepted() -> None:
    assert loaded("officer-landscape.docx").text.split() == ["an", "example", "1"]


def test_a_table_nested_in_a_cell_gives_its_words_to_the_cell() -> None:
    text = loaded("python-docx-blk-paras-and-tables.docx").text
    assert "Text before Table Between Text after" in text


def test_docx_merged_cells_keep_the_columns_aligned() -> None:
    text = loaded("officer-example.docx").text
    assert "| Petals | Internode | Sepal | Bract |" in text
    assert "| 5,645575295 | Merged cell | 2,278691288 |  |" in text


def test_equations_are_read_as_word_shows_them() -> None:
    text = loaded("latinmodern-math.docx").text
    assert "x+an=k=1n" in text and "pięć" in text


def test_a_decks_group_shapes_and_table_are_on_their_slide() -> None:
    [(place, text)] = loaded("python-pptx-test-slides.pptx").places
    assert place == "slide 1" and "Group test text" in text
    assert "| Col head 1 | Col head 2 |\n| --- | --- |\n| Cell text 1 | Cell text 2 |" in text


def test_a_slide_table_is_headed_by_its_first_row_with_text() -> None:
    places = dict(loaded("officer-example.pptx").places)
    assert places["slide 3"].startswith("# Slide 3\n\n| a |  |  |  | d |\n| --- |")
    assert places["slide 2"].startswith("# Hi\n\n- This is\n  - an unordered\n")


def test_odt_words_at_the_edges_of_styled_spans_stay_apart() -> None:
    text = loaded("aprx-manual.odt").text
    assert re.search(r"maxreq\s+3", text) and "maxreq3" not in text
    assert "Aprx 2.9 Manual,  version  1.12" in text  # "version1.12" before


def test_odt_footnotes_follow_the_paragraph_that_cites_them() -> None:
    text = loaded("aprx-manual.odt").text
    note = "[^2]: Until version 2.08 the cycle-size was a global setting."
    assert note in text
    assert text.index(note) > text.index("cycle-size")


def test_rtf_code_pages_are_decoded() -> None:
    assert "Il a fermé la porte" in loaded("la-dame.rtf").text  # \'e9, Windows-1252
    pddl = loaded("odc-pddl.rtf").text  # \mac: MacRoman dashes
    assert "Open Data Commons \u2013 Public Domain Dedication & Licence (PDDL)" in pddl


def test_each_question_names_a_corpus_file_and_a_place_it_has() -> None:
    lines = (ROOT / "office" / "questions.jsonl").read_text(encoding="utf-8").splitlines()
    questions = [json.loads(line) for line in lines]
    assert len(questions) >= 10 and len({q["id"] for q in questions}) == len(questions)
    for question in questions:
        folder, name = question["file"].split("/")
        assert folder == "office" and name in OFFICE, question
        places = dict(loaded(name).places)
        if name.endswith(".pptx"):
            assert f"slide {question['slide']}" in places, question
        else:
            assert "slide" not in question and "page" not in question, question


def test_another_reader_runs_through_the_same_measure() -> None:
    """What a benchmark does with markitdown or unstructured: any `Path -> str` reader."""
    paths = [ROOT / "office" / "la-dame.rtf", ROOT / "sheets" / "deaths.xlsx"]

    def failing(path: Path) -> str:
        raise ValueError("cannot read " + path.suffix)

    per_file, overall = measure_all(reference_text, paths)
    assert [item["recall"] for item in per_file] == [1.0, 1.0]
    assert "place_recall" not in per_file[1]  # an alternative's text has no places
    json.dumps([per_file, overall])
    per_file, overall = measure_all(failing, paths)
    assert overall["refused"] == ["office/la-dame.rtf", "sheets/deaths.xlsx"]
    assert per_file[0]["refused"] == "ValueError: cannot read .rtf"
