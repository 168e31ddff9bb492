"""The PDF loader on real PDFs nobody here wrote (tests/realdocs/pdf), against pdftotext's text
and pdfium's, page by page: words found and not invented, no glued words, two-column pages
read in order, hand-transcribed tables cell by cell (tests/realdocs/fidelity/pdf.py says how
each is measured). Speed is the benchmark's to measure (benchmarks/fidelity.py), not a
test's: a busy machine would fail it."""

from __future__ import annotations

import pytest

from tests.realdocs.fidelity import pdf as fidelity
from tests.realdocs.fidelity.words import NO_WORDS, Order, total, words
from tests.realdocs.questions import questions

WORDS = 0.98
ORDER = 0.95
TABLE_CELLS = 0.95
# Display mathematics laid out in two dimensions (its appendix is all formulas): pdftotext
# and the loader set the sub- and superscripts of a formula apart differently.
PRECISION = {"elsarticle-elstest-5p.pdf": 0.97}


@pytest.fixture(scope="module")
def measured() -> dict[str, fidelity.PdfFidelity]:
    read = fidelity.loader_reader()
    return {found.name: found for found in fidelity.measure_all(read)}


@pytest.mark.parametrize("name", fidelity.pdf_names())
def test_a_real_pdf_keeps_its_words_and_invents_none(
    name: str, measured: dict[str, fidelity.PdfFidelity]
) -> None:
    found = measured[name]
    score = found.against_pdftotext
    assert found.text_pages > 0
    assert score.recall >= WORDS, (name, score, found.worst_pages[:3])
    assert score.precision >= PRECISION.get(name, WORDS), (name, score, found.worst_pages[:3])


@pytest.mark.parametrize("name", fidelity.pdf_names())
def test_no_words_are_glued_where_the_reference_has_none(
    name: str, measured: dict[str, fidelity.PdfFidelity]
) -> None:
    assert measured[name].glued == []


def test_the_corpus_as_a_whole_keeps_its_words(measured: dict[str, fidelity.PdfFidelity]) -> None:
    overall = total(found.against_pdftotext for found in measured.values())
    assert overall.recall >= WORDS and overall.precision >= WORDS, overall
    assert overall.reference > 50_000  # the measure covers a real corpus
    assert overall != NO_WORDS


@pytest.mark.parametrize("name", sorted(fidelity.truth().two_column))
def test_two_column_pages_are_read_in_order(
    name: str, measured: dict[str, fidelity.PdfFidelity]
) -> None:
    order = measured[name].order
    assert order.sentences >= 50
    assert order.score >= ORDER, (name, order)
    assert order.in_place == order.found, (name, order)  # whatever is found is in place


def test_reading_order_over_all_two_column_pages(
    measured: dict[str, fidelity.PdfFidelity],
) -> None:
    order = sum((found.order for found in measured.values()), Order(0, 0, 0))
    assert order.score >= ORDER, order


def test_hand_transcribed_tables_are_read_cell_by_cell(
    measured: dict[str, fidelity.PdfFidelity],
) -> None:
    cells = sum(found.table_cells for found in measured.values())
    found = sum(found.table_cells_found for found in measured.values())
    assert cells >= 200
    assert found / cells >= TABLE_CELLS, (found, cells)


def test_running_headers_and_footers_are_left_out(
    measured: dict[str, fidelity.PdfFidelity],
) -> None:
    """The conference line of every acmart page and the TUGboat draft stamp recur on every
    page in pdftotext's text; the loader keeps none of them."""
    read = fidelity.loader_reader()
    for name, furniture in [
        ("acmart-sample-sigconf.pdf", "Woodstock, NY"),
        ("tugboat-babelbib.pdf", "preliminary draft, September 24, 2008"),
    ]:
        pages, _seconds = read((fidelity.PDF_FOLDER / name).read_bytes())
        assert sum(furniture in page for page in pages) <= 1, name  # page 1 may cite it


def test_code_listings_are_code_blocks_with_their_line_numbers() -> None:
    read = fidelity.loader_reader()
    pages, _seconds = read((fidelity.PDF_FOLDER / "iodhbwm-listings.pdf").read_bytes())
    listing = pages[1].split("```")[1]
    assert listing.splitlines()[1:5] == [
        "1  /*",
        "2   * This is a test class doing nothing",
        "3   */",
        "4  public class TestClass () {",
    ]
    assert "| 1 |" not in pages[1]


def test_words_broken_at_line_ends_are_joined() -> None:
    read = fidelity.loader_reader()
    pages, _seconds = read((fidelity.PDF_FOLDER / "acmart-sample-sigconf.pdf").read_bytes())
    text = "\n".join(pages)
    assert "proceedings or journal publication" in " ".join(text.split())
    assert "proceed-\nings" not in text
    assert "double-blind initial submission" in " ".join(text.split())


def test_every_pdf_question_is_answered_on_the_page_it_names() -> None:
    """The loader's text of the page a question names holds the words of its answer: a miss
    in benchmarks/realdocs_questions.py is then the ranking's, not the text's."""
    read = fidelity.loader_reader()
    pages_of: dict[str, list[str]] = {}
    asked = [q for q in questions() if q.format == "pdf"]
    assert len(asked) >= 20
    for question in asked:
        name = question.file.removeprefix("pdf/")
        if name not in pages_of:
            pages_of[name] = read((fidelity.PDF_FOLDER / name).read_bytes())[0]
        wanted = {word for word in words(question.answer) if len(word) > 2}
        place = question.place["page"]
        numbers = place if isinstance(place, list) else [place]
        found = [wanted - set(words(pages_of[name][n - 1])) for n in numbers]
        assert min(found, key=len) == set(), (question.id, found)


def test_headings_are_markdown_headings_ranked_by_size() -> None:
    read = fidelity.loader_reader()
    pages, _seconds = read((fidelity.PDF_FOLDER / "cassbeam.pdf").read_bytes())
    headings = [line for page in pages for line in page.splitlines() if line.startswith("#")]
    assert headings[:4] == [
        "# CASSBEAM",
        "# 1 Introduction",
        "## 1.1 Sample use case",
        "## 1.2 Limitations",
    ]
