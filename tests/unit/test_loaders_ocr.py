"""OCR: scanned PDF pages and images read by tesseract, its time allowance, OCR off, and a
missing engine. Tests that run tesseract need Debian's tesseract-ocr (`make ocr`)."""

from __future__ import annotations

import io
import re
import shutil
import sys

import pytest
from pydantic import ValidationError
from pypdf import PdfWriter

from ingest.loaders import DocumentLimits, load_bytes
from ingest.loaders.image_files import parse_image
from ingest.loaders.parsing import ParseError
from ingest.loaders.pdf import parse_pdf
from ragservice.config import IngestSettings
from ragservice.types import LoadedDocument, LoadFailure
from tests import corpus_pdf

needs_tesseract = pytest.mark.skipif(
    shutil.which("tesseract") is None, reason="tesseract is not installed (make ocr)"
)

LIMITS = DocumentLimits(max_pages=20, max_chars=1_000_000, parse_seconds=30, ocr_page_seconds=30)
OFF = DocumentLimits(max_pages=20, max_chars=1_000_000, ocr="off")
SCAN_TEXT = "\n".join(corpus_pdf.SCAN_LINES)
NEEDS_OCR = (
    "page 1 needs OCR, but tesseract is not installed "
    "(install Debian's tesseract-ocr, or set RAGSERVICE_OCR=off)"
)


def one(name: str, data: bytes, limits: DocumentLimits = LIMITS) -> LoadedDocument | LoadFailure:
    (result,) = load_bytes(name, data, limits=limits)
    return result


def error_rate(read: str, expected: str) -> float:
    """Levenshtein distance over the expected length, whitespace runs as one space."""
    a, b = re.sub(r"\s+", " ", read).strip(), re.sub(r"\s+", " ", expected).strip()
    previous = list(range(len(b) + 1))
    for i, char in enumerate(a, start=1):
        current = [i]
        for j, other in enumerate(b, start=1):
            current.append(
                min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char != other))
            )
        previous = current
    return previous[-1] / max(len(b), 1)


@pytest.fixture(scope="module")
def mixed_pdf() -> bytes:
    """Page 1 has a text layer (a table), page 2 is a scan."""
    writer = PdfWriter()
    for part in (corpus_pdf.table_pdf(), corpus_pdf.scanned_pdf()):
        writer.append(io.BytesIO(part))
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


@needs_tesseract
def test_a_scanned_page_is_ocrd_in_its_place(mixed_pdf: bytes) -> None:
    doc = one("mixed.pdf", mixed_pdf)
    assert isinstance(doc, LoadedDocument), doc
    assert doc.metadata["ocr"] is True
    assert doc.metadata["ocr_pages"] == [2]
    assert doc.metadata["pages"] == 2 and len(doc.page_starts) == 2
    scanned = doc.text[doc.page_starts[1] :]
    assert error_rate(scanned, SCAN_TEXT) <= 0.03, scanned
    assert doc.text[: doc.page_starts[1]].startswith(corpus_pdf.BEFORE_TABLE)
    assert doc.format == "markdown"  # page 1's table


def test_ocr_off_leaves_a_scanned_page_empty(mixed_pdf: bytes) -> None:
    doc = one("mixed.pdf", mixed_pdf, OFF)
    assert isinstance(doc, LoadedDocument), doc
    assert "ocr" not in doc.metadata
    assert doc.page_starts == (0, len(doc.text))
    assert one("scan.pdf", corpus_pdf.scanned_pdf(), OFF) == LoadFailure(
        "scan.pdf", "no text could be extracted"
    )


@needs_tesseract
def test_a_png_of_text_is_read() -> None:
    doc = one("note.png", corpus_pdf.text_png())
    assert isinstance(doc, LoadedDocument), doc
    assert error_rate(doc.text, SCAN_TEXT) <= 0.03, doc.text
    assert doc.metadata["file_type"] == "image"
    assert (doc.metadata["ocr"], doc.metadata["ocr_pages"], doc.page_starts) == (True, [1], (0,))


@needs_tesseract
def test_a_multi_frame_tiff_is_one_page_a_frame() -> None:
    pages = [["First frame about copper"], ["Second frame about timber"]]
    doc = one("fax.tiff", corpus_pdf.text_tiff(pages))
    assert isinstance(doc, LoadedDocument), doc
    first, second = doc.text[: doc.page_starts[1]], doc.text[doc.page_starts[1] :]
    assert "copper" in first and "timber" in second
    assert (doc.metadata["pages"], doc.metadata["ocr_pages"]) == (2, [1, 2])


def test_an_image_with_ocr_off_fails_saying_so() -> None:
    result = one("note.png", corpus_pdf.text_png(), OFF)
    assert isinstance(result, LoadFailure)
    assert "OCR is off" in result.reason


@needs_tesseract
def test_a_broken_image_fails_alone() -> None:
    result = one("broken.png", corpus_pdf.text_png()[:200])
    assert isinstance(result, LoadFailure)
    assert result.reason.startswith("not a valid image")


@needs_tesseract
def test_each_ocrd_page_extends_the_parse_time_limit() -> None:
    """Three pages take far longer than the file's own 0.3 s: the allowance carries them."""
    data = corpus_pdf.scanned_pdf([corpus_pdf.SCAN_LINES] * 3)
    tight = DocumentLimits(max_pages=5, max_chars=100_000, parse_seconds=0.3, ocr_page_seconds=30)
    doc = one("three.pdf", data, tight)
    assert isinstance(doc, LoadedDocument), doc
    assert doc.metadata["ocr_pages"] == [1, 2, 3]


@needs_tesseract
def test_a_page_over_its_ocr_allowance_fails() -> None:
    slow = DocumentLimits(max_pages=5, max_chars=100_000, ocr_page_seconds=0.01)
    result = one("scan.pdf", corpus_pdf.scanned_pdf(), slow)
    assert result == LoadFailure(
        "scan.pdf", "OCR of page 1 took longer than 0.01 s (RAGSERVICE_OCR_PAGE_SECONDS)"
    )


def test_without_tesseract_a_page_that_needs_ocr_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    import pytesseract

    monkeypatch.setattr(pytesseract.pytesseract, "tesseract_cmd", "/nonexistent/tesseract")
    with pytest.raises(ParseError) as caught:
        parse_pdf(corpus_pdf.scanned_pdf(), LIMITS)
    assert str(caught.value) == NEEDS_OCR
    assert parse_pdf(corpus_pdf.table_pdf(), LIMITS).text  # text pages need no engine
    with pytest.raises(ParseError, match="the image needs OCR, but tesseract is not installed"):
        parse_image(corpus_pdf.text_png(), LIMITS)


def test_without_pytesseract_a_page_that_needs_ocr_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pytesseract", None)  # import fails
    with pytest.raises(ParseError, match="page 1 needs OCR, but pytesseract is not installed"):
        parse_pdf(corpus_pdf.scanned_pdf(), LIMITS)


@needs_tesseract
def test_a_language_without_its_data_fails_saying_so() -> None:
    unknown = DocumentLimits(max_pages=5, max_chars=100_000, ocr_languages="zzz")
    result = one("note.png", corpus_pdf.text_png(), unknown)
    assert isinstance(result, LoadFailure)
    assert result.reason.startswith("OCR of the image failed: ")
    assert "zzz" in result.reason
    assert result.reason.endswith(
        "(install tesseract's language data, or set RAGSERVICE_OCR_LANGUAGES)"
    )


def test_ocr_settings_reach_the_parser_limits() -> None:
    settings = IngestSettings(ocr="off", ocr_languages="eng+deu", ocr_page_seconds=12)
    limits = DocumentLimits.from_settings(settings)
    assert (limits.ocr, limits.ocr_languages, limits.ocr_page_seconds) == ("off", "eng+deu", 12)
    for bad in ("eng deu", "eng;rm", "+eng", ""):
        with pytest.raises(ValidationError):
            IngestSettings(ocr_languages=bad)
    with pytest.raises(ValidationError):
        IngestSettings(ocr="always")  # type: ignore[arg-type]
