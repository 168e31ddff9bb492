"""PDF text as a document (pdf.text), the strokes a page draws (pdf.rules) and what pdfium's
words leave out (pdf.words), on pieces and small generated PDFs."""

from __future__ import annotations

import pypdfium2
import pytest
from fpdf import FPDF

from ingest.loaders.pdf.blocks import margin_key
from ingest.loaders.pdf.layout import PageLayout, Piece, lay_out
from ingest.loaders.pdf.rules import page_rules, ruled_grids
from ingest.loaders.pdf.text import compose, repeats
from ingest.loaders.pdf.words import pdfium_words


def page(*lines: str, header: str | None = None, footer: str | None = None) -> PageLayout:
    pieces = [Piece(header, margin=margin_key(header))] if header else []
    pieces += [Piece(line) for line in lines]
    if footer:
        pieces.append(Piece(footer, margin=margin_key(footer)))
    return PageLayout(pieces)


# -------------------------------------------------------------------------- headers and footers


def test_a_running_header_and_page_numbers_are_dropped_where_they_recur() -> None:
    pages = [page(f"text {n}", header="Annual Report 2025", footer=str(n)) for n in range(1, 9)]
    texts = compose(pages).pages
    assert texts == [f"text {n}" for n in range(1, 9)]


def test_a_first_line_that_does_not_recur_stays() -> None:
    pages = [page("body", header=f"Chapter {title}") for title in ("One", "Two", "Three")]
    assert compose(pages).pages == ["Chapter One\nbody", "Chapter Two\nbody", "Chapter Three\nbody"]


def test_a_one_page_document_keeps_its_first_and_last_lines() -> None:
    assert compose([page("body", header="Title", footer="1")]).pages == ["Title\nbody\n1"]


@pytest.mark.parametrize(("pages", "least"), [(2, 2), (8, 2), (9, 3), (100, 25)])
def test_how_often_furniture_recurs(pages: int, least: int) -> None:
    assert repeats(pages) == least


# -------------------------------------------------------------------------- hyphenation


def test_a_word_broken_at_a_line_end_is_joined() -> None:
    (text,) = compose([page("the paper was sub-", "mitted in May")]).pages
    assert text == "the paper was submitted\nin May"


def test_a_compound_the_document_writes_with_its_hyphen_keeps_it() -> None:
    pages = [page("a well-known result", "it is well-", "known to all")]
    assert compose(pages).pages == ["a well-known result\nit is well-known\nto all"]


def test_a_word_the_document_writes_whole_is_joined_whole() -> None:
    pages = [page("the dataset is large", "the data-", "set is ours")]
    assert compose(pages).pages == ["the dataset is large\nthe dataset\nis ours"]


def test_no_join_before_a_capital_or_a_digit() -> None:
    texts = compose([page("Smith-", "Jones wrote it"), page("COVID-", "19 cases")]).pages
    assert texts == ["Smith-\nJones wrote it", "COVID-\n19 cases"]


def test_a_line_that_is_only_the_rest_of_a_word_disappears_into_it() -> None:
    assert compose([page("inter-", "national", "next")]).pages == ["international\nnext"]


# -------------------------------------------------------------------------- Markdown


def test_a_line_starting_with_a_hash_is_escaped_in_markdown() -> None:
    table = Piece("| a | b |\n| --- | --- |\n| 1 | 2 |", "table", True)
    layout = PageLayout([Piece("# not a heading"), table, Piece("```not a fence")], tables=1)
    composed = compose([layout])
    assert composed.markdown
    assert composed.pages[0].splitlines()[0] == "\\# not a heading"
    assert composed.pages[0].splitlines()[-1] == "\\```not a fence"


def test_plain_text_is_not_escaped() -> None:
    composed = compose([page("# 1 priority")])
    assert not composed.markdown
    assert composed.pages == ["# 1 priority"]


# -------------------------------------------------------------------------- rules and words


def test_a_drawn_grid_is_a_ruled_table_filled_with_its_words() -> None:
    pdf = FPDF(unit="pt")
    pdf.add_page()
    pdf.set_font("Helvetica", size=10)
    for row, cells in enumerate([("Name", "Qty"), ("bolts", "12"), ("nuts", "40")]):
        for column, cell in enumerate(cells):
            pdf.set_xy(100 + 120 * column, 100 + 20 * row)
            pdf.cell(120, 20, cell, border=1)
    document = pypdfium2.PdfDocument(bytes(pdf.output()))
    try:
        rules = page_rules(document[0])
        grids = ruled_grids(rules)
        layout = lay_out(pdfium_words(document[0]), grids, rules)
    finally:
        document.close()
    assert len(grids) == 1 and len(grids[0].rows) == 3
    assert [p.text for p in layout.pieces] == [
        "| Name | Qty |\n| --- | --- |\n| bolts | 12 |\n| nuts | 40 |"
    ]


def test_a_single_rule_makes_no_table() -> None:
    pdf = FPDF(unit="pt")
    pdf.add_page()
    pdf.set_font("Helvetica", size=10)
    pdf.text(72, 100, "A footnote follows the rule below.")
    pdf.line(72, 700, 200, 700)
    document = pypdfium2.PdfDocument(bytes(pdf.output()))
    try:
        rules = page_rules(document[0])
    finally:
        document.close()
    assert [(round(r.x0), round(r.x1), r.horizontal) for r in rules] == [(72, 200, True)]
    assert ruled_grids(rules) == []


def test_text_off_the_page_and_a_rotated_stamp_are_left_out() -> None:
    pdf = FPDF(unit="pt")
    pdf.add_page()
    pdf.set_font("Helvetica", size=11)
    for row in range(12):
        pdf.text(72, 100 + 16 * row, f"Line {row} of the body text that is read upright.")
    pdf.text(4000, 100, "hidden overlay")
    with pdf.rotation(45, 300, 400):
        pdf.text(300, 400, "DRAFT")
    document = pypdfium2.PdfDocument(bytes(pdf.output()))
    try:
        words = [word.text for word in pdfium_words(document[0])]
    finally:
        document.close()
    assert "hidden" not in words and "DRAFT" not in words
    assert words[:3] == ["Line", "0", "of"]


# -------------------------------------------------------------------------- headings


def line(text: str, size: float = 10.0, *, bold: bool = False, apart: bool = True) -> Piece:
    """A line piece as `layout` makes it, shaped as a heading where its text is."""
    shaped = len(text.split()) <= 12 and text[-1:] not in ".,;:"
    return Piece(text, "line", apart, None, size, shaped, bold, apart)


BODY = "Text set at the size most of the document is set in, a sentence of it."


def test_larger_and_bold_lines_become_headings_ranked_by_size() -> None:
    layout = PageLayout(
        [
            line("A Manual", 20.0),
            line("1 Introduction", 14.0),
            line(BODY),
            line("1.1 Scope", 10.0, bold=True),
            line(BODY),
            line(BODY, apart=False),
        ]
    )
    (text,) = compose([layout]).pages
    assert text.split("\n\n")[:4] == ["# A Manual", "## 1 Introduction", BODY, "### 1.1 Scope"]
    assert compose([layout]).markdown


def test_a_heading_wrapped_over_two_lines_is_one_heading() -> None:
    first, second = "Multilingual Bibliographies: Using and", "extending the babelbib package"
    pieces = [line(first, 14.0), line(second, 14.0, apart=False)]
    (text,) = compose([PageLayout([*pieces, line(BODY)])]).pages
    assert text.startswith(f"# {first} {second}\n\n")


def test_larger_paragraphs_and_runs_of_labels_stay_text() -> None:
    """Three lines of a larger size are a paragraph (an abstract, an address block); lines of
    one size one after another are labels or names (a figure's, an author list)."""
    block = [line("Simon Fear", 12.0), line("300A route", 12.0, apart=False)]
    block += [line("Meyrin", 12.0, apart=False)]
    labels = [line("City", 18.0), line("Pipe", 18.0), line("Steam", 18.0)]
    (text,) = compose([PageLayout([*block, line(BODY), *labels, line(BODY)])]).pages
    assert "#" not in text


def test_a_sentence_or_a_long_line_is_no_heading() -> None:
    pieces = [line("A sentence set large ends with a stop.", 16.0), line(BODY)]
    pieces.append(
        Piece(
            "one two three four five six seven eight nine ten eleven twelve thirteen",
            "line",
            True,
            None,
            16.0,
            False,
            False,
            True,
        )
    )
    assert "#" not in compose([PageLayout([*pieces, line(BODY)])]).pages[0]
