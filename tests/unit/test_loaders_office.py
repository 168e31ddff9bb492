"""Office, spreadsheet and text formats (PPTX, XLSX, CSV, TSV, ODT, RTF) through `load_bytes`
and the parsing sandbox; zip bombs in their clothing; and files embedded in files (children):
how they cross the sandbox's pipe and become documents of their own."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from typing import Any

import openpyxl
import pytest

from ingest.loaders import DocumentLimits, load_bytes, load_file
from ingest.loaders.loading import load_fetched
from ingest.loaders.parsing import Child, Parsed, ParseError
from ingest.loaders.replies import child_name, decode_parsed, encode_parsed
from ingest.loaders.sandbox import parse_isolated
from ragservice.chunking import ChunkingOptions, chunk_text, place_chunks
from ragservice.limits.documents import NO_TEXT
from ragservice.types import LoadedDocument, LoadFailure, SkippedFile
from tests.corpus_office import (
    BLANK_ROW,
    CSV_TEXT,
    DECK_TITLE,
    Q3_ROWS,
    Q3_TOTAL,
    RTF_TEXT,
    TSV_TEXT,
    make_chart_deck,
    make_deck,
    make_odt,
    make_workbook,
    make_wrapped_docx,
    q3_item,
    rewrite_member,
    with_many_packed_members,
    with_zeros_member,
)

LIMITS = DocumentLimits(max_pages=50, max_chars=1_000_000, parse_seconds=20)


def results(name: str, data: bytes, limits: DocumentLimits = LIMITS) -> list[Any]:
    return list(load_bytes(name, data, limits=limits))


def document(name: str, data: bytes) -> LoadedDocument:
    [result] = results(name, data)
    assert isinstance(result, LoadedDocument), result
    return result


def failure(name: str, data: bytes, limits: DocumentLimits = LIMITS) -> str:
    [result] = results(name, data, limits)
    assert isinstance(result, LoadFailure), result
    assert result.source == name
    return result.reason


def line_at(text: str, offset: int) -> str:
    return text[offset:].split("\n", 1)[0]


@pytest.fixture(scope="module")
def deck() -> LoadedDocument:
    return document("deck.pptx", make_deck())


@pytest.fixture(scope="module")
def workbook() -> LoadedDocument:
    return document("book.xlsx", make_workbook())


# --------------------------------------------------------------------------- PPTX


def test_a_deck_is_one_section_per_slide_with_bullets_tables_and_notes(
    deck: LoadedDocument,
) -> None:
    assert deck.text == (
        "# Quarterly Review\n\nFinance team\n\n"
        "# Highlights\n\n- Revenue grew 12%\n  - Europe led\n- Costs stayed flat\n\n"
        "Notes: Mention the Europe numbers.\n\n"
        "# Numbers\n\n| Region | Q2 | Q3 |\n| --- | --- | --- |\n| Europe | 10 | 12 |\n"
        "| A\\|B | 8 | 9 |\n\n"
        "# Slide 4\n\nClosing remarks"
    )
    assert (deck.title, deck.format, deck.page_unit) == (DECK_TITLE, "markdown", "slide")
    assert deck.metadata["file_type"] == "pptx" and deck.metadata["slides"] == 5
    headings = [line_at(deck.text, start) for start in deck.page_starts[:4]]
    assert headings == ["# Quarterly Review", "# Highlights", "# Numbers", "# Slide 4"]
    assert deck.page_starts[4] == len(deck.text)  # the empty slide 5: no text, its number kept
    assert deck.page_names == () and deck.row_starts == ()


def test_a_decks_core_title_wins_over_its_first_slide() -> None:
    assert document("titled.pptx", make_deck("Board Pack")).title == "Board Pack"


def test_a_deck_over_the_slide_limit_fails_before_its_text_is_read() -> None:
    limits = DocumentLimits(max_pages=4, max_chars=1_000_000)
    assert failure("long.pptx", make_deck(), limits) == (
        "the file has 5 slides; the limit is 4 (RAGSERVICE_MAX_DOCUMENT_PAGES)"
    )


def test_a_charts_titles_are_its_slides_words_and_a_one_row_table_is_paragraphs() -> None:
    charts = document("charts.pptx", make_chart_deck())
    assert charts.text == (
        "# Slide 1\n\nChart: Revenue by region (Quarter, EUR)\n\n"
        "# Slide 2\n\nLeft words\n\nRight words"
    )


# --------------------------------------------------------------------------- DOCX


def test_docx_content_controls_tracked_changes_and_text_boxes_are_read_once() -> None:
    wrapped = document("wrapped.docx", make_wrapped_docx())
    assert wrapped.text == (
        "Plain first\n\nInside a content control\n\nKept inserted\n\nAnchor\n\nBoxed words"
    )


# --------------------------------------------------------------------------- XLSX


def test_a_sheet_of_numbers_from_its_first_row_is_headed_by_its_column_letters() -> None:
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet.title = "Readings"
    for row in ([None, 1, 2.5], [None, 2, 3.5]):
        sheet.append(row)
    out = io.BytesIO()
    book.save(out)
    readings = document("readings.xlsx", out.getvalue())
    assert readings.text == "# Readings\n\n| B | C |\n| --- | --- |\n| 1 | 2.5 |\n| 2 | 3.5 |"
    assert [number for _, number in readings.row_starts] == [1, 2]


def test_a_workbook_is_a_heading_and_a_table_per_sheet(workbook: LoadedDocument) -> None:
    summary = (
        "# Summary\n\n| Metric | Value |\n| --- | --- |\n| Opened | 2024-07-01 |\n"
        "| Ratio | 2.5 |\n| Count | 3 |\n| Audited | TRUE |"
    )
    assert workbook.text.startswith(summary + "\n\n# Q3\n\n| Item | Amount | Note |\n| --- |")
    assert (workbook.title, workbook.page_unit) == ("Results 2024", "sheet")
    assert workbook.page_names == ("Summary", "Q3")
    assert [line_at(workbook.text, s) for s in workbook.page_starts] == ["# Summary", "# Q3"]
    assert workbook.metadata["file_type"] == "xlsx" and workbook.metadata["sheets"] == 2


def test_each_sheet_row_is_anchored_at_its_own_row_number(workbook: LoadedDocument) -> None:
    anchors = dict((number, offset) for offset, number in workbook.row_starts[4:])  # Q3's
    assert line_at(workbook.text, anchors[12]) == "| item 12 | 110 | pipe \\| inside |"
    assert line_at(workbook.text, anchors[2]) == "| item 2 | 10 |  |"
    assert BLANK_ROW not in anchors  # a blank row has no line
    numbers = [number for _, number in workbook.row_starts]
    assert numbers == [2, 3, 4, 5, *(n for n in range(2, Q3_ROWS + 3) if n != BLANK_ROW)]
    offsets = [offset for offset, _ in workbook.row_starts]
    assert offsets == sorted(offsets) and workbook.page_starts[1] < offsets[4]
    for offset, number in workbook.row_starts[4:-1]:
        assert line_at(workbook.text, offset).startswith(f"| {q3_item(number)} |")


def test_a_formula_gives_the_value_excel_cached(workbook: LoadedDocument) -> None:
    total = workbook.row_starts[-1][0]
    assert line_at(workbook.text, total) == f"| Total | {Q3_TOTAL} |  |"
    assert "SUM(" not in workbook.text
    # Without a cached value (as openpyxl itself saves formulas) the cell is empty, not its
    # formula: what the row shows is the cache, read because of data_only.
    uncached = document("uncached.xlsx", make_workbook(cached_total=False))
    assert line_at(uncached.text, uncached.row_starts[-1][0]) == "| Total |  |  |"


class Words:
    """A tokenizer of whitespace-separated words (the chunker's budget, without a model)."""

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        return [match.span() for match in re.finditer(r"\S+", text)]


def test_chunks_of_a_sheet_are_cited_by_sheet_and_rows(workbook: LoadedDocument) -> None:
    # What the loader's maps are for: the chunker's citations of slides, sheets and rows.
    chunks = chunk_text(
        workbook.text,
        tokenizer=Words(),
        options=ChunkingOptions(max_tokens=80, overlap_tokens=0),
        format=workbook.format,
        page_starts=workbook.page_starts,
    )
    placed = place_chunks(chunks, "sheet", workbook.page_names, workbook.row_starts)
    labels = [chunk.pages.label for chunk in placed if chunk.pages is not None]
    assert labels[0] == 'sheet "Summary", rows 2\u20135'
    assert all(label.startswith('sheet "Q3", rows ') for label in labels[1:])
    assert labels[-1].endswith(f"\u2013{Q3_ROWS + 2}")  # the total row


def test_a_workbook_over_the_character_limit_fails_while_it_is_read() -> None:
    limits = DocumentLimits(max_pages=50, max_chars=500)
    assert failure("big.xlsx", make_workbook(), limits) == (
        "the text is over 500 characters (RAGSERVICE_MAX_DOCUMENT_CHARS)"
    )


# --------------------------------------------------------------------------- CSV and TSV


def test_a_csv_is_one_table_with_sniffed_delimiter_and_numbered_rows() -> None:
    table = document("cities.csv", CSV_TEXT.encode())
    assert table.text == (
        "| city | population | note |\n| --- | --- | --- |\n| Oslo | 709000 | capital |\n"
        '| Bergen | 291000 | rainy; "wet" |\n| Tromsø | 77000 | north\\|far |'
    )
    assert (table.page_unit, table.page_starts, table.page_names) == ("sheet", (0,), ("",))
    assert [number for _, number in table.row_starts] == [2, 3, 5]  # row 4 is blank
    assert line_at(table.text, table.row_starts[2][0]).startswith("| Tromsø |")
    assert table.metadata["file_type"] == "csv" and table.title is None


def test_a_csv_with_no_usual_delimiter_is_one_column() -> None:
    table = document("words.csv", b"word\nalpha\nbeta\n")
    assert table.text == "| word |\n| --- |\n| alpha |\n| beta |"


def test_a_tsv_splits_on_tabs() -> None:
    table = document("scores.tsv", TSV_TEXT.encode())
    assert table.text == ("| name | score |\n| --- | --- |\n| ada | 10 |\n| bob |  |\n| cy | 7 |")
    assert [number for _, number in table.row_starts] == [2, 3, 5]


def test_an_empty_csv_has_no_text() -> None:
    assert failure("empty.csv", b"\n\n , \n") == NO_TEXT


def test_a_csv_over_the_character_limit_fails_while_it_is_read() -> None:
    limits = DocumentLimits(max_pages=50, max_chars=1000)
    assert failure("long.csv", b"a,b\n" + b"1,2\n" * 1000, limits) == (
        "the text is over 1000 characters (RAGSERVICE_MAX_DOCUMENT_CHARS)"
    )


# --------------------------------------------------------------------------- ODT and RTF


def test_an_odt_has_headings_paragraphs_lists_and_tables() -> None:
    odt = document("notes.odt", make_odt())
    assert odt.text == (
        "# Introduction\n\nThe first paragraph.\n\n## Details\n\n- alpha point\n- beta point"
        "\n\n| Kind | Size |\n| --- | --- |\n| small | 1 |\n| large | 9 |\n\nThe last paragraph."
    )
    assert (odt.title, odt.format, odt.metadata["file_type"]) == ("Field Notes", "markdown", "odt")


def test_an_rtf_is_its_plain_text_and_info_title() -> None:
    rtf = document("memo.rtf", RTF_TEXT.encode("ascii"))
    assert rtf.text == "Dear team,\nThe café opens at nine.\nBold words."
    assert (rtf.title, rtf.format) == ("Memo Title", "text")


def test_a_text_file_named_rtf_is_refused() -> None:
    assert failure("plain.rtf", b"just text") == (
        "not a valid RTF file: it does not start with {\\rtf"
    )


# --------------------------------------------------------------------------- damaged files


@pytest.mark.parametrize("suffix", [".pptx", ".xlsx", ".odt"])
@pytest.mark.parametrize("data", [b"not a zip", b"PK\x03\x04broken"])
def test_a_damaged_office_file_fails_with_a_short_reason(suffix: str, data: bytes) -> None:
    reason = failure("broken" + suffix, data)
    assert reason.startswith(f"not a valid {suffix[1:].upper()} file: ")
    assert len(reason) < 250


def test_a_parser_that_prints_does_not_garble_the_sandboxs_replies() -> None:
    # odfpy prints the whole XML of a part it cannot parse (and goes on without it). In the
    # sandbox stdout is not the pipe to the parent, so the reply comes back, and the next.
    broken = rewrite_member(make_odt(), "styles.xml", b"<office:styles", b"</x><office:styles")
    assert document("broken-style.odt", broken).title == "Field Notes"
    assert document("after.csv", b"a\n1\n").text == "| a |\n| --- |\n| 1 |"


def test_an_odt_whose_body_is_not_well_formed_is_refused_not_half_read() -> None:
    broken = rewrite_member(make_odt(), "content.xml", b"<text:h", b"</x><text:h")
    assert failure("broken.odt", broken).startswith(
        "not a valid ODT file: its content.xml is malformed (mismatched tag: line "
    )


def test_a_workbook_renamed_pptx_fails() -> None:
    assert failure("odd.pptx", make_workbook()).startswith("not a valid PPTX file: ")


# --------------------------------------------------------------------------- zip bombs


@pytest.mark.parametrize(
    ("name", "make", "folder"),
    [
        ("bomb.pptx", make_deck, "ppt/media"),
        ("bomb.xlsx", make_workbook, "xl/media"),
        ("bomb.odt", make_odt, "Pictures"),
    ],
)
def test_office_zip_bombs_are_refused_before_they_are_unpacked(
    name: str, make: Any, folder: str
) -> None:
    zeros = with_zeros_member(make(), f"{folder}/zeros.bin")
    assert len(zeros) < 200_000  # 20 MiB of zeros in a few kilobytes
    reason = failure(name, zeros)
    assert reason.startswith(f"refused: '{folder}/zeros.bin' is compressed ")
    assert reason.endswith("(a zip bomb?)")
    packed = with_many_packed_members(make(), folder)
    kind = name.rpartition(".")[2].upper()
    assert failure(name, packed).startswith(f"refused: the {kind} unpacks to ")


# --------------------------------------------------------------------------- children: the pipe


def test_embedded_files_cross_the_pipe_with_every_field() -> None:
    parsed = Parsed(
        "# S\n\n| a |\n| --- |\n| 1 |",
        "T",
        "markdown",
        {"k": 1},
        (0,),
        "sheet",
        ("S",),
        ((19, 2),),
        (Child("a.txt", b"\x00\xffbytes", {"from": "x"}),),
    )
    wire = json.loads(json.dumps(encode_parsed(parsed)))
    assert decode_parsed(wire, LIMITS) == parsed


def wire(**change: Any) -> dict[str, Any]:
    base = encode_parsed(Parsed("# One\n\n| a |\n| --- |\n| 1 |", None, "markdown"))
    return {**base, "page_starts": [0], **change}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"row_starts": [[30, 2]]}, "row map"),  # past the end
        ({"row_starts": [[20, 3], [10, 4]]}, "row map"),  # out of order
        ({"row_starts": [[20, 3], [20, 4]]}, "row map"),  # two rows at one place
        ({"row_starts": [[20, 0]]}, "row map"),
        ({"row_starts": [[20, True]]}, "row map"),
        ({"row_starts": [[20]]}, "row map"),
        ({"row_starts": {"20": 2}}, "row map"),
        ({"page_names": ["a", "b"]}, "page names"),
        ({"page_names": [3]}, "page names"),
        ({"page_unit": "chapter"}, "page unit"),
        ({"children": [{"name": "a", "data": "not base64!"}]}, "embedded file"),
        ({"children": [{"data": ""}]}, "embedded file"),
        ({"children": "a"}, "embedded files"),
        ({"format": "html"}, "not a document"),
    ],
)
def test_a_reply_that_does_not_fit_its_text_is_refused(change: dict[str, Any], reason: str) -> None:
    with pytest.raises(ParseError, match=reason):
        decode_parsed(wire(**change), LIMITS)


def test_embedded_files_are_bounded_in_number_and_size(monkeypatch: pytest.MonkeyPatch) -> None:
    child = {"name": "a.txt", "data": "eHl6", "metadata": {}}  # b"xyz"
    monkeypatch.setattr("ingest.loaders.replies.MAX_CHILDREN", 2)
    with pytest.raises(ParseError, match="more than 2 embedded files"):
        decode_parsed(wire(children=[child] * 3), LIMITS)
    monkeypatch.setattr("ingest.loaders.replies.MAX_CHILDREN_BYTES", 5)
    with pytest.raises(ParseError, match="embedded files come to more than"):
        decode_parsed(wire(children=[child] * 2), LIMITS)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("report.pdf", "report.pdf"),
        ("../../etc/passwd", ".._.._etc_passwd"),
        ("a\\b\n c.txt", "a_b c.txt"),
        ("", "attachment"),
        ("..", "attachment"),
        ("x" * 300 + ".docx", "x" * 250 + ".docx"),
    ],
)
def test_an_embedded_files_name_is_one_safe_segment(name: str, expected: str) -> None:
    assert child_name(name) == expected


def test_the_sandbox_sends_a_sheets_maps_back_checked() -> None:
    parsed = parse_isolated(".csv", CSV_TEXT.encode(), LIMITS)
    assert (parsed.page_unit, parsed.page_names, len(parsed.row_starts)) == ("sheet", ("",), 3)


# --------------------------------------------------------------------------- children: loading

FAKE = b"FAKE:"


def fake(text: str = "", children: list[tuple[str, bytes, dict[str, Any]]] | None = None) -> bytes:
    """A file the fake parser below reads: its text and its embedded files."""
    kids = [{"name": n, "data": d.decode("latin-1"), "metadata": m} for n, d, m in children or []]
    return FAKE + json.dumps({"text": text, "children": kids}).encode()


@pytest.fixture
def fake_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """`.txt` files that start with FAKE parse as containers; the rest in the sandbox."""

    def parse(suffix: str, data: bytes, limits: DocumentLimits) -> Parsed:
        if not data.startswith(FAKE):
            return parse_isolated(suffix, data, limits)
        spec = json.loads(data[len(FAKE) :])
        kids = tuple(
            Child(k["name"], k["data"].encode("latin-1"), k["metadata"]) for k in spec["children"]
        )
        return Parsed(spec["text"], None, "text", {"kind": "fake"}, children=kids)

    monkeypatch.setattr("ingest.loaders.loading.parse_isolated", parse)


def loaded_all(name: str, data: bytes, **kwargs: Any) -> Iterator[Any]:
    return iter(load_bytes(name, data, limits=LIMITS, **kwargs))


@pytest.mark.usefixtures("fake_parser")
def test_embedded_files_become_documents_linked_to_their_parent() -> None:
    message = fake(
        "the message body",
        [
            ("notes.txt", b"attached notes", {"content_type": "text/plain"}),
            ("notes.txt", b"another with the same name", {}),
            ("picture.xyz", b"\x89PNG", {}),
            ("empty.txt", b"", {}),
        ],
    )
    parent, png, first, second, empty = loaded_all("mail.txt", message, metadata={"team": "a"})
    ids = ["mail.txt/notes.txt", "mail.txt/notes (2).txt", "mail.txt/picture.xyz"]
    assert isinstance(parent, LoadedDocument)
    assert parent.metadata["attachments"] == [*ids[:2], "mail.txt/empty.txt"]
    assert parent.metadata["skipped_attachments"] == ["picture.xyz"]
    assert parent.metadata["team"] == "a"
    assert isinstance(first, LoadedDocument) and isinstance(second, LoadedDocument)
    assert (first.external_id, first.text, first.source) == (ids[0], "attached notes", ids[0])
    assert first.metadata == {
        "content_type": "text/plain",
        "parent": "mail.txt",
        "source_path": ids[0],
        "file_type": "text",
        "team": "a",
    }
    assert (second.external_id, second.metadata["parent"]) == (ids[1], "mail.txt")
    # One no loader reads is skipped (named by its parent and itself, after the parent); one
    # that cannot be read fails alone.
    assert png == SkippedFile(ids[2], "unsupported file type .xyz")
    assert empty == LoadFailure("mail.txt/empty.txt", NO_TEXT)


@pytest.mark.usefixtures("fake_parser")
def test_a_container_without_text_yields_only_its_files_nested_two_deep() -> None:
    attachment = fake("", [("deep.txt", b"too deep", {})])
    message = fake("a message", [("a.txt", b"attached", {}), ("inner.txt", attachment, {})])
    mbox = fake("", [("m1.txt", message, {"subject": "hi"})])
    found = list(loaded_all("box.txt", mbox))
    assert [getattr(r, "external_id", None) or r.source for r in found] == [
        "box.txt/m1.txt",
        "box.txt/m1.txt/a.txt",
        "box.txt/m1.txt/inner.txt/deep.txt",
    ]
    message_doc, attached, deep = found
    assert message_doc.metadata["parent"] == "box.txt"
    assert message_doc.metadata["subject"] == "hi"
    assert attached.metadata["parent"] == "box.txt/m1.txt"
    assert deep == SkippedFile(
        "box.txt/m1.txt/inner.txt/deep.txt", "embedded files nested more than 2 deep are not read"
    )


@pytest.mark.usefixtures("fake_parser")
def test_load_file_yields_embedded_files_under_the_files_path(tmp_path: Any) -> None:
    path = tmp_path / "mail.txt"
    path.write_bytes(fake("body", [("a.txt", b"attached", {})]))
    parent, child = load_file(path, "inbox/mail.txt", limits=LIMITS)
    assert isinstance(parent, LoadedDocument) and isinstance(child, LoadedDocument)
    assert (child.external_id, child.source) == ("inbox/mail.txt/a.txt", f"{path}/a.txt")
    assert child.metadata["parent"] == "inbox/mail.txt"


@pytest.mark.usefixtures("fake_parser")
def test_load_fetched_yields_embedded_files_under_the_sources_id() -> None:
    url = "https://mail.example/inbox/1.txt"
    data = fake("body", [("a.txt", b"attached", {})])
    parent, child = load_fetched(url, "1.txt", data, limits=LIMITS)
    assert isinstance(parent, LoadedDocument) and isinstance(child, LoadedDocument)
    assert (child.external_id, child.source) == (f"{url}/a.txt", f"{url}/a.txt")
    assert child.metadata["parent"] == url


@pytest.mark.usefixtures("fake_parser")
def test_a_container_with_nothing_in_it_has_no_text() -> None:
    assert list(loaded_all("none.txt", fake())) == [LoadFailure("none.txt", NO_TEXT)]
