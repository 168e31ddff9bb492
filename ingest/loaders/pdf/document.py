"""PDF: each page's text in reading order, its tables as Markdown tables, its code as code
blocks, scanned pages OCR'd; running headers and footers left out, hyphenated words joined.

pypdf opens the file first (cheap: the cross-reference table only) to fail early: no `%PDF-`
header, encryption other than an empty user password, more pages than the limit; its title.
pdfium then reads each page's words with their boxes and fonts (`words`) and the lines it
draws (`rules`: ruled tables, booktabs rules), and `layout` puts them in reading order
as pieces; a page without any character but with an image is a scan, rendered by pdfium and
OCR'd. `text` then reads the pieces as a document (running headers and footers,
hyphenation) into each page's text. The pages' texts are joined by a blank line, and where
each page starts in the whole is kept (`Parsed.page_starts`), so chunks can name their pages.
A PDF with a table or a code block is Markdown, so the chunker keeps its rows whole; others
stay plain text.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pypdfium2
import pypdfium2.raw as pdfium_c
from pypdf import PasswordType, PdfReader
from pypdf.errors import DependencyError

from ingest.loaders.cleaning import clean_text, clean_title
from ingest.loaders.ocr import check_image_size, ocr_enabled, ocr_image
from ingest.loaders.parsing import Parsed, ParseError, bad_content, describe
from ingest.loaders.pdf.layout import PageLayout, Piece, lay_out
from ingest.loaders.pdf.rules import page_rules, ruled_grids
from ingest.loaders.pdf.text import compose
from ingest.loaders.pdf.words import has_image, pdfium_words
from ragservice.limits.documents import DocumentLimits
from ragservice.types import PAGE_SEPARATOR, TextFormat

_OCR_DPI = 300
_MAX_RENDER_PIXELS = 60_000_000


@dataclass
class _Reading:
    """What reading the pages found beyond their text."""

    ocr_pages: list[int] = field(default_factory=list)
    chars: int = 0


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
            layouts = list(_pdf_pages(document, limits, reading))
        finally:
            document.close()
    composed = compose(layouts)
    pages = [clean_text(page) for page in composed.pages]
    text = PAGE_SEPARATOR.join(page for page in pages if page)
    metadata: dict[str, Any] = {"pages": len(pages)}
    if reading.ocr_pages:
        metadata.update(ocr=True, ocr_pages=reading.ocr_pages)
    text_format: TextFormat = "markdown" if composed.markdown else "text"
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
    document: pypdfium2.PdfDocument, limits: DocumentLimits, reading: _Reading
) -> Iterator[PageLayout]:
    """Each page's layout; stops, failing, as soon as the text is over the limit."""
    for index in range(len(document)):
        page = document[index]
        try:
            layout = _page_layout(page, index, limits, reading)
        finally:
            page.close()
        reading.chars += sum(len(piece.text) + 1 for piece in layout.pieces)
        if reading.chars > limits.max_chars:
            raise ParseError(
                f"the text is over {limits.max_chars} characters (RAGSERVICE_MAX_DOCUMENT_CHARS)"
            )
        yield layout


def _page_layout(
    page: pypdfium2.PdfPage, index: int, limits: DocumentLimits, reading: _Reading
) -> PageLayout:
    """pdfium's words and rules laid out; OCR for a scan."""
    words = pdfium_words(page)
    if not words and has_image(page) and ocr_enabled(limits):
        reading.ocr_pages.append(index + 1)
        _check_images(page, index + 1)
        text = clean_text(ocr_image(_render(page), limits, f"page {index + 1}").strip())
        return PageLayout([Piece(text)] if text else [])
    rules = page_rules(page) if words else []
    return lay_out(words, ruled_grids(rules), rules)


def _check_images(page: pypdfium2.PdfPage, number: int) -> None:
    """ParseError for an image on the page over `MAX_IMAGE_PIXELS`, by the size its dictionary
    declares: rendering would decode it whole, however small the page is rendered."""
    for image in page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE]):
        width, height = image.get_px_size()
        check_image_size(width, height, f"page {number}: ")


def _render(page: pypdfium2.PdfPage) -> Any:
    """The page as a grey image at 300 dpi (less for a huge page), for OCR."""
    width, height = page.get_size()
    scale = _OCR_DPI / 72
    pixels = width * height * scale * scale
    if pixels > _MAX_RENDER_PIXELS:
        scale *= (_MAX_RENDER_PIXELS / pixels) ** 0.5
    return page.render(scale=scale, grayscale=True).to_pil()


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
