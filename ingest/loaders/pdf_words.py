"""A PDF page's words with their boxes, from pdfium or from pdfplumber, for `pdf_layout`.

pdfium (C) reads a page's characters and their boxes in a few milliseconds; pdfplumber
(pdfminer, pure Python) takes 50 to 100 ms a page but finds ruled tables from the lines
drawn. So a page is read by pdfium unless it draws something (a path object: lines, boxes),
where a ruled table may be, and then by pdfplumber. Both give boxes top-down in points.
"""

from __future__ import annotations

from typing import Any

import pypdfium2
import pypdfium2.raw as pdfium_c

from ingest.loaders.pdf_layout import Table, Word, ruled_tables

_CHAR_GAP = 3.0  # points: characters further apart are separate words (pdfplumber's default)


def draws_lines(page: pypdfium2.PdfPage) -> bool:
    """Whether the page (or a form it shows) has a path object: a ruled table may be there."""
    return next(page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_PATH]), None) is not None


def has_image(page: pypdfium2.PdfPage) -> bool:
    return next(page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE]), None) is not None


def pdfium_words(page: pypdfium2.PdfPage) -> list[Word]:
    """The page's words: runs of characters that are not spaces, on one line, close together
    (pdfium adds the spaces and line ends a page only implies; they split words too)."""
    text_page = page.get_textpage()
    try:
        count = text_page.count_chars()
        text = text_page.get_text_range(0, count) if count else ""
        boxes = [text_page.get_charbox(index, loose=True) for index in range(len(text))]
    finally:
        text_page.close()
    words: list[Word] = []
    current: list[str] = []
    x0 = x1 = top = bottom = 0.0
    for char, (left, low, right, high) in zip(text, boxes, strict=True):
        if char.isspace() or (not char.isprintable() and char != "\ufffd"):
            if current:
                words.append(Word("".join(current), x0, x1, top, bottom))
                current = []
            continue
        char_top, char_bottom = -high, -low  # pdfium's y grows upwards
        near = left - x1 <= _CHAR_GAP and abs(char_top - top) < 0.5 * (bottom - top or 1)
        if current and not near:
            words.append(Word("".join(current), x0, x1, top, bottom))
            current = []
        if not current:
            x0, top, bottom = left, char_top, char_bottom
        current.append(char)
        x1 = max(x1, right) if len(current) > 1 else right
        top, bottom = min(top, char_top), max(bottom, char_bottom)
    if current:
        words.append(Word("".join(current), x0, x1, top, bottom))
    return words


def plumber_words(page: Any) -> tuple[list[Word], list[Table]]:
    """A pdfplumber page's words and ruled tables (the tables' words left out)."""
    tables = ruled_tables(page) if page.edges else []
    words = [
        Word(str(found["text"]), *(float(found[key]) for key in ("x0", "x1", "top", "bottom")))
        for found in page.extract_words()
        if str(found["text"]).strip()
    ]
    return [word for word in words if not any(table.holds(word) for table in tables)], tables
