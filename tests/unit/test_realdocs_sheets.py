"""The real spreadsheets, CSV and TSV files of the corpus (tests/realdocs/sheets) through the
real loaders: each is accepted, gives every value its library reads, on the right sheet, and
its rows are cited by the numbers the sheet gives them, under the header that names them."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import openpyxl
import pytest

from ingest.loaders import DocumentLimits, load_file
from ingest.loaders.parsing import Parsed
from ingest.loaders.sandbox import PARSERS
from ragservice.types import LoadedDocument
from tests.realdocs.fidelity.office import OfficeFidelity, measure
from tests.realdocs.sources import ROOT, sources

SHEETS = [source.name for source in sources(("sheets",))]
LIMITS = DocumentLimits(max_pages=2000, max_chars=5_000_000, parse_seconds=60)
RECALL = 0.95
FLOORS = {
    # Its one non-ASCII byte, 0xAE (Windows-1252's registered sign, in every row's index
    # name), is guessed to be ISO 8859-16 by the text decoding all text formats share
    # (`cleaning.decode_bytes`), so "Microcap®" comes out as "Microcapź": 19 of 218 words.
    "russell-crlf.csv": 0.91,
}


@cache
def fidelity(name: str) -> OfficeFidelity:
    return measure(ROOT / "sheets" / name)


@cache
def parsed(name: str) -> Parsed:
    return PARSERS[Path(name).suffix][1]((ROOT / "sheets" / name).read_bytes(), LIMITS)


def row_line(found: Parsed, number: int, sheet: str = "") -> str:
    """The table line of row `number` of `sheet` (by name; the first sheet by default)."""
    index = found.page_names.index(sheet) if sheet else 0
    start = found.page_starts[index]
    end = ([*found.page_starts, len(found.text)])[index + 1]
    [offset] = [at for at, row in found.row_starts if row == number and start <= at < end]
    return found.text[offset:].split("\n", 1)[0]


def sheet_row(name: str, sheet: str, first_cell: str) -> int:
    """The number openpyxl gives the row of `sheet` whose first cell is `first_cell`."""
    book = openpyxl.load_workbook(ROOT / "sheets" / name, read_only=True)
    rows = book[sheet].iter_rows(values_only=True)
    number = next(i for i, row in enumerate(rows, 1) if row and row[0] == first_cell)
    book.close()
    return number


def test_the_corpus_has_each_format() -> None:
    assert {Path(name).suffix for name in SHEETS} == {".xlsx", ".csv", ".tsv"}


@pytest.mark.parametrize("name", SHEETS)
def test_each_file_is_accepted_with_every_value_its_library_reads(name: str) -> None:
    result = fidelity(name)
    assert result.accepted, result.refused
    assert result.score.recall >= FLOORS.get(name, RECALL), result.as_json()


@pytest.mark.parametrize("name", [n for n in SHEETS if n.endswith(".xlsx")])
def test_every_value_of_a_sheet_is_on_that_sheet(name: str) -> None:
    result = fidelity(name)
    assert result.place_score is not None and result.place_score.recall == 1.0, result.as_json()


@pytest.mark.parametrize("name", SHEETS)
def test_each_file_loads_through_the_sandbox(name: str) -> None:
    [result] = list(load_file(ROOT / "sheets" / name, name, limits=LIMITS))
    assert isinstance(result, LoadedDocument), result


def test_notes_above_a_table_are_text_and_the_column_names_its_header() -> None:
    found = parsed("deaths.xlsx")
    arts = found.text[found.page_starts[0] : found.page_starts[1]]
    notes, table = arts.split("\n\n| ", 1)
    assert notes == (
        "# arts\n\nLots of people\nsimply cannot resist writing some notes\n"
        "at the top of their spreadsheets\nor merging cells"
    )
    assert table.startswith("Name | Profession | Age | Has kids | Date of birth | Date of death |")
    bowie = sheet_row("deaths.xlsx", "arts", "David Bowie")
    assert row_line(found, bowie, "arts") == (
        "| David Bowie | musician | 69 | TRUE | 1947-01-08 | 2016-01-10 |"
    )


def test_a_two_row_header_keeps_its_first_row_as_the_header() -> None:
    found = parsed("clippy.xlsx")
    assert "# two-row-header\n\n| name | species | death | weight |\n| --- |" in found.text
    line = row_line(found, 2, "two-row-header")
    assert line == "| (at birth) | (office supply type) | (date is approximate) | (in grams) |"


def test_dates_of_the_1904_system_are_the_dates_excel_shows() -> None:
    found = parsed("gdata-example-1904.xlsx")
    sheet = found.page_names.index("Sheet with a very long name!")
    assert found.text[found.page_starts[sheet] :].count("| 2001-01-01 | 01:01:00 |") == 1
    line = row_line(found, 2, "Sheet with a very long name!")
    assert line.startswith("| 2 | 2002-02-02 | 02:02:00 |")


def test_a_workbook_without_a_part_it_names_is_read_whole() -> None:
    found = parsed("datasets.xlsx")  # names a drawing the archive does not hold
    assert found.page_names == ("iris", "mtcars", "chickwts", "quakes")
    assert len([row for _, row in found.row_starts]) == 150 + 32 + 71 + 1000


def test_inline_strings_and_sheets_in_workbook_order() -> None:
    assert "| written with writexl::write_xlsx |" in parsed("writexl-inline-strings.xlsx").text
    assert parsed("libreoffice-sheets-order.xlsx").page_names == ("b", "e", "d", "a")


def test_csv_quoting_delimiters_and_encodings() -> None:
    newline = parsed("quoted-newlines.csv")
    assert row_line(newline, 9) == '| 1 | embedded "field" with some embedded new lines as well |'
    semicolons = parsed("semicolons-utf8.csv")
    assert semicolons.text.startswith("| Ort | Straße | Bezeichnung |")
    assert row_line(semicolons, 2) == '| Vienna | Testgasse 1 | Ministerium "Pestalozzi" |'


def test_a_tsv_is_split_on_tabs() -> None:
    taxi = parsed("taxi.tsv")
    assert taxi.text.startswith("| reading_package | manip_package | op | type | time |")
    assert row_line(taxi, 2).startswith("| data.table | data.table | setup | process |")


def test_each_question_names_a_corpus_file_a_sheet_it_has_and_its_rows() -> None:
    lines = (ROOT / "sheets" / "questions.jsonl").read_text(encoding="utf-8").splitlines()
    questions = [json.loads(line) for line in lines]
    assert len(questions) >= 10 and len({q["id"] for q in questions}) == len(questions)
    for question in questions:
        folder, name = question["file"].split("/")
        assert folder == "sheets" and name in SHEETS, question
        found = parsed(name)
        sheet = question.get("sheet", "")
        assert sheet in found.page_names, question  # a CSV's one sheet has no name
        for number in question.get("rows", []):
            assert row_line(found, number, sheet), question
