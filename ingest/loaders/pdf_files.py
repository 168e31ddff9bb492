"""PDF: each page's text, bounded by the page and character limits; empty-password encryption
is opened, any other is a failure."""

from __future__ import annotations

import io
from collections.abc import Iterator

from pypdf import PasswordType, PdfReader
from pypdf.errors import DependencyError

from ingest.loaders.cleaning import clean_text, clean_title
from ingest.loaders.limits import DocumentLimits
from ingest.loaders.parsing import Parsed, ParseError, bad_content, describe


def parse_pdf(data: bytes, limits: DocumentLimits) -> Parsed:
    if b"%PDF-" not in data[:1024]:  # where the PDF specification allows the header
        raise ParseError("not a valid PDF: it has no %PDF- header")
    with bad_content("not a valid PDF"):
        reader = PdfReader(io.BytesIO(data))
        _unlock(reader)
        _check_page_count(len(reader.pages), limits)
        pages = list(_pdf_pages(reader, limits))
        title = clean_title(reader.metadata.title if reader.metadata else None)
    text = "\n\n".join(page for page in pages if page)
    return Parsed(text, title, "text", {"pages": len(pages)})


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
