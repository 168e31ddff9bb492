"""How large one document may be, and the reasons a document fails a per-document check."""

from __future__ import annotations

from dataclasses import dataclass

from ragservice.config import IngestSettings, get_settings
from ragservice.limits.shape import MAX_EXTERNAL_ID_BYTES, MAX_JSON_DEPTH

NO_TEXT = "no text could be extracted"
ID_TOO_LONG = f"the external id is longer than {MAX_EXTERNAL_ID_BYTES} bytes"
TOO_DEEP = f"the metadata is nested deeper than {MAX_JSON_DEPTH} levels"


@dataclass(frozen=True)
class DocumentLimits:
    """The most pages (PDF) and extracted characters one document may have, and the seconds
    (CPU and wall-clock) and memory parsing one file may take; more is a per-file failure.

    OCR (`ocr`: "auto" or "off", tesseract's `ocr_languages`) rides along because the limits
    are what reaches the parsing sandbox's child; each page it OCRs adds `ocr_page_seconds`
    to the file's time limit, since a scan of many pages takes seconds a page."""

    max_pages: int
    max_chars: int
    parse_seconds: float = 60.0
    parse_memory_mib: int = 2048
    ocr: str = "auto"
    ocr_languages: str = "eng"
    ocr_page_seconds: float = 30.0

    @classmethod
    def from_settings(cls, ingest: IngestSettings) -> DocumentLimits:
        return cls(
            max_pages=ingest.max_document_pages,
            max_chars=ingest.max_document_chars,
            parse_seconds=ingest.parse_timeout_seconds,
            parse_memory_mib=ingest.parse_memory_mib,
            ocr=ingest.ocr,
            ocr_languages=ingest.ocr_languages,
            ocr_page_seconds=ingest.ocr_page_seconds,
        )


def resolve_limits(limits: DocumentLimits | None) -> DocumentLimits:
    # None: the process's own settings, which is what the server and the CLI run with.
    return limits or DocumentLimits.from_settings(get_settings().ingest)


def too_long(text: str, limits: DocumentLimits) -> str:
    if len(text) <= limits.max_chars:
        return ""
    return (
        f"the text has {len(text)} characters; the limit is {limits.max_chars} "
        "(RAGSERVICE_MAX_DOCUMENT_CHARS)"
    )
