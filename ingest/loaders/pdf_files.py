"""PDF: each page's text, bounded by the page and character limits; empty-password encryption
is opened, any other is a failure. The pages' texts are joined by a blank line, and where each
page starts in the whole is kept (`Parsed.page_starts`), so chunks can name their pages."""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence

from pypdf import PasswordType, PdfReader
from pypdf.errors import DependencyError

from ingest.loaders.cleaning import clean_text, clean_title
from ingest.loaders.parsing import Parsed, ParseError, bad_content, describe
from ragservice.limits.documents import DocumentLimits
from ragservice.types import PAGE_SEPARATOR


def parse_pdf(data: bytes, limits: DocumentLimits) -> Parsed:
    if b"%PDF-" not in data[:1024]:  # where the PDF specification allows the header
        raise ParseError("not a valid PDF: it has no %PDF- header")
    with bad_content("not a valid PDF"):
        reader = PdfReader(io.BytesIO(data))
        _unlock(reader)
        _check_page_count(len(reader.pages), limits)
        pages = list(_pdf_pages(reader, limits))
        title = clean_title(reader.metadata.title if reader.metadata else None)
    text = PAGE_SEPARATOR.join(page for page in pages if page)
    return Parsed(text, title, "text", {"pages": len(pages)}, page_starts(pages))


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


def _pdf_pages(reader: PdfReader, limits: DocumentLimits) -> Iterator[str]:
    """Each page's clean text; stops, failing, as soon as the text is over the limit."""
    total = 0
    for page in reader.pages:
        text = clean_text(page.extract_text())
        total += len(text)
        if total > limits.max_chars:
            raise ParseError(
                f"the text is over {limits.max_chars} characters (RAGSERVICE_MAX_DOCUMENT_CHARS)"
            )
        yield text


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
