"""The formats the loaders read: the one list of them, from which everything else is derived.

Each `Format` says which suffixes pick it, its MIME types, what its citations name (pages,
slides, sheets, rows), the extra it needs (pyproject's optional-dependencies) and the limits
it is held to. The sandbox's parsers, the folder walker, the upload route's check and
description, the API's `GET /v1/formats` (the web console's list) and the table in
docs/ingest.md (`format_table`, checked by a test) all read `FORMATS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

CitationUnit = Literal["page", "slide", "sheet", "row"]
"""What a citation of a format's document names: PDF pages, slides, sheets and rows, rows."""

Limit = Literal["pages", "zip"]
"""`pages`: its pages (slides, sheets, frames) count against RAGSERVICE_MAX_DOCUMENT_PAGES;
`zip`: a zip-based file, refused when it looks like a zip bomb."""


@dataclass(frozen=True, slots=True)
class Format:
    """One format the loaders read."""

    kind: str
    """Its name in a document's metadata (`file_type`): `pdf`, `email`, `image`."""
    suffixes: tuple[str, ...]
    mime_types: tuple[str, ...]
    read_with: str
    """The libraries that read it, as the docs' table says."""
    text: str
    """What its text becomes, as the docs' table says."""
    citation: CitationUnit | None = None
    cited_as: str = ""
    """How a citation names a place in it (`p. 7`), for the docs' table."""
    extra: str | None = None
    """The optional part of the install it needs (`ragservice.extras`), None: none."""
    limits: tuple[Limit, ...] = ()


_OOXML = "application/vnd.openxmlformats-officedocument"

FORMATS: tuple[Format, ...] = (
    Format("text", (".txt",), ("text/plain",), "(decoded, charset detected)", "as is"),
    Format(
        "markdown",
        (".md", ".markdown"),
        ("text/markdown", "text/x-markdown"),
        "(decoded, charset detected)",
        "as is; Markdown headings followed",
    ),
    Format(
        "html",
        (".html", ".htm"),
        ("text/html", "application/xhtml+xml"),
        "BeautifulSoup, trafilatura",
        "the main content as Markdown",
    ),
    Format(
        "pdf",
        (".pdf",),
        ("application/pdf",),
        "pypdf (header, encryption, title), pdfium (words, fonts, drawn lines), pdfplumber's "
        "cell finder (ruled tables)",
        "reading order; headings by size; tables as Markdown tables; code as code blocks; two "
        "columns read in order; running headers, footers, contents and index entries left out; "
        "hyphenated words joined; scans through OCR (with the `ocr` extra)",
        citation="page",
        cited_as="pages (`p. 7`, `pp. 7\u20138`)",
        limits=("pages",),
    ),
    Format(
        "docx",
        (".docx",),
        (f"{_OOXML}.wordprocessingml.document",),
        "python-docx",
        "headings, lists, tables as Markdown tables, headers and footers once",
        limits=("zip",),
    ),
    Format(
        "pptx",
        (".pptx",),
        (f"{_OOXML}.presentationml.presentation",),
        "python-pptx",
        "`# <slide title>` per slide, bullets, tables, chart titles, `Notes: …`",
        citation="slide",
        cited_as="slides (`slide 4`)",
        limits=("pages", "zip"),
    ),
    Format(
        "xlsx",
        (".xlsx",),
        (f"{_OOXML}.spreadsheetml.sheet",),
        "openpyxl (read-only; formulas as their cached values)",
        "`# <sheet>` and a table per sheet, notes above it as text",
        citation="sheet",
        cited_as='sheets and rows (`sheet "Q3", rows 12\u201340`)',
        limits=("pages", "zip"),
    ),
    Format(
        "csv",
        (".csv",),
        ("text/csv",),
        "Python's csv",
        "one table, header = row 1",
        citation="row",
        cited_as="rows (`rows 12\u201340`)",
    ),
    Format(
        "tsv",
        (".tsv",),
        ("text/tab-separated-values",),
        "Python's csv",
        "one table, header = row 1",
        citation="row",
        cited_as="rows (`rows 12\u201340`)",
    ),
    Format(
        "odt",
        (".odt",),
        ("application/vnd.oasis.opendocument.text",),
        "odfpy",
        "headings by outline level, paragraphs, lists, tables, footnotes",
        limits=("zip",),
    ),
    Format("rtf", (".rtf",), ("application/rtf", "text/rtf"), "striprtf", "plain text"),
    Format(
        "epub",
        (".epub",),
        ("application/epub+zip",),
        "zipfile, lxml (its own tolerant package reader)",
        "chapters in spine order as Markdown (chapters are heading paths)",
        limits=("zip",),
    ),
    Format(
        "email",
        (".eml",),
        ("message/rfc822",),
        "Python's email",
        "a `From`/`To`/`Cc`/`Date`/`Subject` block, then every inline text part (of "
        "alternatives, the plain one); attachments are documents of their own, those no "
        "loader reads skipped",
    ),
    Format(
        "mbox",
        (".mbox",),
        ("application/mbox",),
        "Python's email",
        "each message a document of its own, read as an `.eml` is",
    ),
    Format(
        "image",
        (".png", ".jpg", ".jpeg", ".tif", ".tiff"),
        ("image/png", "image/jpeg", "image/tiff"),
        "Pillow, tesseract (OCR)",
        "the OCR'd text; a TIFF's frames are pages",
        citation="page",
        cited_as="pages",
        extra="ocr",
        limits=("pages",),
    ),
    Format(
        "jsonl",
        (".jsonl",),
        ("application/jsonl", "application/x-ndjson"),
        "Python's json",
        "one document per line ([below](#importing-precomputed-embeddings))",
    ),
    Format(
        "parquet",
        (".parquet",),
        ("application/vnd.apache.parquet",),
        "pyarrow",
        "one document per id, with its vectors ([below](#importing-precomputed-embeddings))",
        extra="parquet",
    ),
)

SUPPORTED_SUFFIXES: tuple[str, ...] = tuple(s for f in FORMATS for s in f.suffixes)
"""File types the loaders read; the API refuses other uploads with 415 before queueing them."""

_BY_SUFFIX: dict[str, Format] = {s: f for f in FORMATS for s in f.suffixes}


def _suffix_of(f: Format, media_type: str) -> str:
    """The suffix a file of `media_type` is named with: the one its subtype names (`.jpeg`,
    `.tiff`), else the format's first."""
    named = "." + media_type.rsplit("/", 1)[-1]
    return named if named in f.suffixes else f.suffixes[0]


SUFFIX_OF_MEDIA_TYPE: dict[str, str] = {m: _suffix_of(f, m) for f in FORMATS for m in f.mime_types}
"""A media type → the suffix of the name a file of that type is read under (a fetched page)."""


def file_type(name: str) -> str:
    """The suffix of the file `name` that picks its loader (`.pdf`), lower case; "" when it has
    none or one no loader reads. The one test of a file's type, at upload and in the job alike:
    a name such as `.txt` has no suffix (it is a hidden file's name), as for `pathlib`."""
    suffix = PurePosixPath(name).suffix.lower()
    return suffix if suffix in _BY_SUFFIX else ""


def format_of(suffix: str) -> Format:
    """The format a supported suffix (`file_type`'s answer) picks; KeyError for another."""
    return _BY_SUFFIX[suffix]


def suffix_list() -> str:
    """The suffixes without their dots, as a sentence: `txt, md, … jsonl or parquet`."""
    names = [s.removeprefix(".") for s in SUPPORTED_SUFFIXES]
    return f"{', '.join(names[:-1])} or {names[-1]}"


_LIMITS: dict[Limit, str] = {
    "pages": "`RAGSERVICE_MAX_DOCUMENT_PAGES`",
    "zip": "zip-bomb check",
}


def format_table() -> str:
    """The Markdown table of the formats in docs/ingest.md (a test keeps the two the same)."""
    lines = [
        "| Suffix | Read with | Text | Pages and citations | Needs | Limits |",
        "|---|---|---|---|---|---|",
    ]
    for f in FORMATS:
        suffixes = ", ".join(f"`{s}`" for s in f.suffixes)
        extra = f"`ragservice[{f.extra}]`" if f.extra else "—"
        limits = ", ".join(_LIMITS[limit] for limit in f.limits) or "—"
        cells = (suffixes, f.read_with, f.text, f.cited_as or "—", extra, limits)
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"
