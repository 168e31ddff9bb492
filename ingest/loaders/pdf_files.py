"""PDF: each page's text in reading order, its tables as Markdown tables, scanned pages OCR'd.

pypdf opens the file first (cheap: the cross-reference table only) to fail early: no `%PDF-`
header, encryption other than an empty user password, more pages than the limit; its title.
pdfium then reads each page's words with their positions, pdfplumber those of a page that
draws lines (`pdf_words`), and `pdf_layout` puts them in reading order with their tables; a
page without any character but with an image is a scan, rendered by pdfium and OCR'd. The
pages' texts are joined by a blank line, and where each page starts in the whole is kept
(`Parsed.page_starts`), so chunks can name their pages. A PDF with a table is Markdown, so the
chunker keeps its rows whole; others stay plain text.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pdfplumber
import pypdfium2
from pypdf import PasswordType, PdfReader
from pypdf.errors import DependencyError

from ingest.loaders.cleaning import clean_text, clean_title
from ingest.loaders.ocr import ocr_enabled, ocr_image
from ingest.loaders.parsing import Parsed, ParseError, bad_content, describe
from ingest.loaders.pdf_layout import Table, Word, lay_out
from ingest.loaders.pdf_words import draws_lines, has_image, pdfium_words, plumber_words
from ragservice.limits.documents import DocumentLimits
from ragservice.types import PAGE_SEPARATOR, TextFormat

_OCR_DPI = 300
_MAX_RENDER_PIXELS = 60_000_000


@dataclass
class _Reading:
    """What reading the pages found beyond their text."""

    tables: int = 0
    ocr_pages: list[int] = field(default_factory=list)


def parse_pdf(data: bytes, limits: DocumentLimits) -> Parsed:
    if b"%PDF-" not in data[:1024]:  # where the PDF specification allows the header
        raise ParseError("not a valid PDF: it has no %PDF- header")
    reading = _Reading()
    with bad_content("not a valid PDF"):
        reader = PdfReader(io.BytesIO(data))
        _unlock(reader)
        _check_page_count(len(reader.pages), limits)
        title = clean_title(reader.metadata.title if reader.metadata else None)
        document = pypdfium2.PdfDocument(data)
        try:
            pages = list(_pdf_pages(document, data, limits, reading))
        finally:
            document.close()
    text = PAGE_SEPARATOR.join(page for page in pages if page)
    metadata: dict[str, Any] = {"pages": len(pages)}
    if reading.ocr_pages:
        metadata.update(ocr=True, ocr_pages=reading.ocr_pages)
    text_format: TextFormat = "markdown" if reading.tables else "text"
    return Parsed(text, title, text_format, metadata, page_starts(pages))


def page_starts(pages: Sequence[str]) -> tuple[int, ...]:
    """Where each page starts in the pages' texts joined by `PAGE_SEPARATOR` (empty pages
    left out of the join): an empty page starts where the text before it ends."""
    starts: list[int] = []
    position, written = 0, False
    for page in pages:
        if page and written:
            position += len(PAGE_SEPARATOR)
        starts.append(position)
        if page:
            position, written = position + len(page), True
    return tuple(starts)


def _check_page_count(count: int, limits: DocumentLimits) -> None:
    if count > limits.max_pages:
        raise ParseError(
            f"the PDF has {count} pages; the limit is {limits.max_pages} "
            "(RAGSERVICE_MAX_DOCUMENT_PAGES)"
        )


def _pdf_pages(
    document: pypdfium2.PdfDocument, data: bytes, limits: DocumentLimits, reading: _Reading
) -> Iterator[str]:
    """Each page's clean text; stops, failing, as soon as the text is over the limit."""
    total = 0
    plumber = _Plumber(data)
    try:
        for index in range(len(document)):
            page = document[index]
            try:
                text = _page_text(page, index, plumber, limits, reading)
            finally:
                page.close()
            total += len(text)
            if total > limits.max_chars:
                raise ParseError(
                    f"the text is over {limits.max_chars} characters "
                    "(RAGSERVICE_MAX_DOCUMENT_CHARS)"
                )
            yield text
    finally:
        plumber.close()


def _page_text(
    page: pypdfium2.PdfPage,
    index: int,
    plumber: _Plumber,
    limits: DocumentLimits,
    reading: _Reading,
) -> str:
    """pdfium's words, or pdfplumber's where lines are drawn; OCR for a scan."""
    words = pdfium_words(page)
    if not words and has_image(page) and ocr_enabled(limits):
        reading.ocr_pages.append(index + 1)
        return clean_text(ocr_image(_render(page), limits, f"page {index + 1}").strip())
    tables: list[Table] = []
    if words and draws_lines(page):
        words, tables = plumber.words(index, words)
    found = lay_out(words, tables)
    reading.tables += found.tables
    return clean_text(found.text)


def _render(page: pypdfium2.PdfPage) -> Any:
    """The page as a grey image at 300 dpi (less for a huge page), for OCR."""
    width, height = page.get_size()
    scale = _OCR_DPI / 72
    pixels = width * height * scale * scale
    if pixels > _MAX_RENDER_PIXELS:
        scale *= (_MAX_RENDER_PIXELS / pixels) ** 0.5
    return page.render(scale=scale, grayscale=True).to_pil()


class _Plumber:
    """pdfplumber's view of the file, opened only if a page draws lines."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pdf: Any = None

    def words(self, index: int, fallback: list[Word]) -> tuple[list[Word], list[Table]]:
        if self._pdf is None:
            self._pdf = pdfplumber.open(io.BytesIO(self._data), password="")
        pages = self._pdf.pages
        if index >= len(pages):  # the two readers disagree on a damaged file
            return fallback, []
        page = pages[index]
        try:
            return plumber_words(page)
        finally:
            page.close()  # pdfplumber keeps each page's objects until closed

    def close(self) -> None:
        if self._pdf is not None:
            self._pdf.close()


def _unlock(reader: PdfReader) -> None:
    """Open an encrypted PDF that has an empty user password (copy/print-protected PDFs)."""
    if not reader.is_encrypted:
        return
    try:
        opened = reader.decrypt("") != PasswordType.NOT_DECRYPTED
    except DependencyError as exc:  # AES needs the optional `cryptography` package
        raise ParseError(f"PDF is encrypted: {describe(exc)}") from exc
    if not opened:
        raise ParseError("PDF is encrypted")
