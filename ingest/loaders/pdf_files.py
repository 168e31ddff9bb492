"""PDF: each page's text in reading order, its tables as Markdown tables, scanned pages OCR'd.

pypdf opens the file first (cheap: the cross-reference table only) to fail early: no `%PDF-`
header, encryption other than an empty user password, more pages than the limit. pdfplumber
then reads each page's words with their positions (`pdf_layout`: tables, two columns); a page
without any character but with an image is a scan, rendered by pdfium and OCR'd (`ocr`). The
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
from pypdf import PasswordType, PdfReader
from pypdf.errors import DependencyError

from ingest.loaders.cleaning import clean_text, clean_title
from ingest.loaders.ocr import ocr_enabled, ocr_image
from ingest.loaders.parsing import Parsed, ParseError, bad_content, describe
from ingest.loaders.pdf_layout import read_page
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
        with pdfplumber.open(io.BytesIO(data), password="") as pdf:
            pages = list(_pdf_pages(pdf, data, limits, reading))
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


def _pdf_pages(pdf: Any, data: bytes, limits: DocumentLimits, reading: _Reading) -> Iterator[str]:
    """Each page's clean text; stops, failing, as soon as the text is over the limit."""
    total = 0
    renderer = _Renderer(data)
    try:
        for number, page in enumerate(pdf.pages, start=1):
            if not page.chars and page.images and ocr_enabled(limits):
                image = renderer.render(number - 1)
                text = clean_text(ocr_image(image, limits, f"page {number}").strip())
                reading.ocr_pages.append(number)
            else:
                found = read_page(page)
                text, reading.tables = clean_text(found.text), reading.tables + found.tables
            page.close()  # pdfplumber keeps each page's objects until closed
            total += len(text)
            if total > limits.max_chars:
                raise ParseError(
                    f"the text is over {limits.max_chars} characters "
                    "(RAGSERVICE_MAX_DOCUMENT_CHARS)"
                )
            yield text
    finally:
        renderer.close()


class _Renderer:
    """Pages as images for OCR, by pdfium, which opens the file only if a page needs it."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._document: Any = None

    def render(self, index: int) -> Any:
        import pypdfium2

        if self._document is None:
            self._document = pypdfium2.PdfDocument(self._data)
        page = self._document[index]
        try:
            width, height = page.get_size()
            scale = _OCR_DPI / 72
            pixels = width * height * scale * scale
            if pixels > _MAX_RENDER_PIXELS:
                scale *= (_MAX_RENDER_PIXELS / pixels) ** 0.5
            return page.render(scale=scale, grayscale=True).to_pil()
        finally:
            page.close()

    def close(self) -> None:
        if self._document is not None:
            self._document.close()


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
