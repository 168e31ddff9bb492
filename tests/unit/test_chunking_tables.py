"""Tables in Markdown text: rows stay whole, the header is repeated, and chunks of slides and
sheets say where they lie (`place_chunks`, `PageSpan`)."""

from __future__ import annotations

import re

import pytest

from ragservice.chunking import (
    TABLE_HEADER,
    ChunkingOptions,
    chunk_text,
    own_text,
    place_chunks,
    rows_of,
)
from ragservice.types import PageSpan, TextChunk, TextFormat


class WordTokenizer:
    """A word or one punctuation mark per token."""

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        return [m.span() for m in re.finditer(r"\w+|[^\w\s]", text)]


HEADER = "| name | value | note |\n| --- | --- | --- |"


def table(rows: int) -> str:
    lines = [f"| item {i} | {i * 10} | row {i} of the sheet |" for i in range(1, rows + 1)]
    return HEADER + "\n" + "\n".join(lines)


def chunks(text: str, max_tokens: int = 80, fmt: TextFormat = "markdown") -> list[TextChunk]:
    options = ChunkingOptions(max_tokens=max_tokens, overlap_tokens=8)
    return chunk_text(text, tokenizer=WordTokenizer(), options=options, format=fmt)


def row_lines(chunk: TextChunk) -> list[str]:
    return [line for line in own_text(chunk.text, chunk.metadata).splitlines() if "item" in line]


def test_a_long_table_is_cut_between_rows_and_every_later_chunk_repeats_the_header() -> None:
    text = "# Q3\n\nThe third quarter.\n\n" + table(40) + "\n\nA closing paragraph."
    found = chunks(text)
    tabular = [c for c in found if "item" in c.text]
    assert len(tabular) > 3
    seen: list[str] = []
    assert HEADER in tabular[0].text
    for c in tabular:
        assert c.text.startswith(HEADER + "\n") or c is tabular[0]  # column names shown
        assert c.token_count <= 80
        assert own_text(c.text, c.metadata) == text[c.start_char : c.end_char]
        seen += row_lines(c)
    # Each row exactly once, whole, in order: no row is split and none repeats.
    assert seen == [line for line in text.splitlines() if "item" in line]
    assert TABLE_HEADER not in tabular[0].metadata  # the first holds the header itself
    assert all(c.metadata[TABLE_HEADER] == HEADER for c in tabular[1:])
    assert tabular[0].text.startswith("# Q3")  # the short lead-in goes with the first rows
    assert found[-1].text == "A closing paragraph."


def test_a_table_that_fits_stays_in_one_chunk_with_its_section() -> None:
    text = "# Summary\n\n" + table(3)
    assert [c.text for c in chunks(text, 254)] == [text]


def test_plain_text_has_no_tables() -> None:
    text = table(40)
    assert all(TABLE_HEADER not in c.metadata for c in chunks(text, fmt="text"))


def test_a_row_too_long_for_any_chunk_is_the_only_one_cut() -> None:
    long_row = "| huge | " + " ".join(f"w{i}" for i in range(200)) + " | x |"
    text = "# T\n\n" + HEADER + "\n| item 1 | 1 | a |\n" + long_row + "\n| item 3 | 3 | c |"
    found = chunks(text, 60)
    assert all(c.token_count <= 60 for c in found)
    assert sum("item 3" in c.text for c in found) == 1
    last = next(c for c in found if "item 3" in c.text)
    assert last.text.startswith(HEADER)


def test_a_separator_without_rows_is_no_table() -> None:
    text = "# T\n\n" + HEADER + "\n\n" + "word " * 200
    assert all(TABLE_HEADER not in c.metadata for c in chunks(text, 60))


def test_rows_of_gives_the_numbered_rows_a_range_holds() -> None:
    starts = [(10, 2), (20, 3), (30, 7), (40, 8)]
    assert rows_of(starts, 0, 25) == (2, 3)
    assert rows_of(starts, 25, 45) == (7, 8)
    assert rows_of(starts, 41, 50) is None


def test_place_chunks_names_the_sheet_and_its_rows() -> None:
    text = "# Summary\n\nTotals.\n\n# Q3\n\n" + table(40)
    q3 = text.index("# Q3")
    row_starts = [(m.start(), n + 2) for n, m in enumerate(re.finditer(r"^\| item", text, re.M))]
    options = ChunkingOptions(max_tokens=80, overlap_tokens=8)
    raw = chunk_text(
        text, tokenizer=WordTokenizer(), options=options, format="markdown", page_starts=[0, q3]
    )
    placed = place_chunks(raw, "sheet", ("Summary", "Q3"), row_starts)
    first, *rest = [c for c in placed if c.pages and c.pages.first == 2]
    assert first.metadata["sheet"] == "Q3" and first.metadata["page_unit"] == "sheet"
    assert first.pages is not None and first.pages.label.startswith('sheet "Q3", rows 2\u2013')
    last = rest[-1]
    assert last.metadata["rows"][1] == 41
    assert placed[0].pages is not None and placed[0].pages.label == 'sheet "Summary"'


def test_place_chunks_leaves_pdf_pages_alone_and_marks_slides() -> None:
    raw = chunks("# One\n\nFirst slide.\n\n# Two\n\nSecond slide.", 254)
    assert place_chunks(raw, "page") is raw
    slides = place_chunks(raw, "slide")
    assert all(c.metadata["page_unit"] == "slide" for c in slides)


@pytest.mark.parametrize(
    ("span", "label"),
    [
        (PageSpan(7, 7), "p. 7"),
        (PageSpan(3, 4), "pp. 3\u20134"),
        (PageSpan(4, 4, "slide"), "slide 4"),
        (PageSpan(4, 6, "slide"), "slides 4\u20136"),
        (PageSpan(2, 2, "sheet", "Q3", (12, 40)), 'sheet "Q3", rows 12\u201340'),
        (PageSpan(2, 2, "sheet", "Q3", (12, 12)), 'sheet "Q3", row 12'),
        (PageSpan(1, 1, "sheet", None, (2, 9)), "rows 2\u20139"),
        (PageSpan(1, 2, "sheet"), "sheets 1\u20132"),
    ],
)
def test_a_span_is_cited_in_its_own_unit(span: PageSpan, label: str) -> None:
    assert span.label == label


def test_covering_spans_merge_rows_of_one_sheet_only() -> None:
    a = PageSpan(2, 2, "sheet", "Q3", (12, 20))
    b = PageSpan(2, 2, "sheet", "Q3", (21, 40))
    assert PageSpan.covering([b, a]) == PageSpan(2, 2, "sheet", "Q3", (12, 40))
    other = PageSpan(3, 3, "sheet", "Q4", (2, 5))
    assert PageSpan.covering([a, other]) == PageSpan(2, 3, "sheet")


def test_a_span_survives_its_json_form() -> None:
    span = PageSpan(2, 2, "sheet", "Q3", (12, 40))
    assert PageSpan.from_json(span.numbers, span.as_json()) == span
    assert PageSpan.from_json([3, 4], None) == PageSpan(3, 4)
    assert PageSpan.from_json([], None) is None
