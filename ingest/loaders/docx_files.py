"""DOCX: paragraphs, headings, lists and tables as Markdown; zip bombs are refused unopened."""

from __future__ import annotations

import io
import re

import docx
from docx.document import Document as DocxDocument
from docx.table import Table, _Row
from docx.text.paragraph import Paragraph

from ingest.loaders.archives import open_archive
from ingest.loaders.cleaning import clean_text, clean_title, collapse
from ingest.loaders.parsing import Parsed, bad_content
from ragservice.limits.documents import DocumentLimits

_HEADING_STYLE = re.compile(r"heading ([1-9])", re.I)


def parse_docx(data: bytes, _limits: DocumentLimits) -> Parsed:
    with bad_content("not a valid DOCX file"):
        open_archive(data, "DOCX")  # refuses a zip bomb before python-docx unpacks it
        document = docx.Document(io.BytesIO(data))
        blocks = [_docx_block(item) for item in document.iter_inner_content()]
        title = clean_title(document.core_properties.title) or _docx_title(document)
    return Parsed(clean_text("\n\n".join(b for b in blocks if b)), title, "markdown")


def _docx_block(item: Paragraph | Table) -> str:
    if isinstance(item, Table):
        return "\n\n".join(row for row in map(_docx_row, item.rows) if row)
    text = item.text.strip()
    style = _style_name(item)
    level = _docx_heading_level(style)
    if not text:
        return ""
    if level:
        return "#" * level + " " + collapse(text)
    return "- " + text if style.startswith("List") else text


def _docx_row(row: _Row) -> str:
    texts: list[str] = []
    previous: object = None
    for cell in row.cells:
        # A merged cell comes back once per grid column it spans.
        if cell._tc is not previous and (text := collapse(cell.text)):
            texts.append(text)
        previous = cell._tc
    return " | ".join(texts)


def _style_name(paragraph: Paragraph) -> str:
    style = paragraph.style
    return (style.name or "") if style is not None else ""


def _docx_heading_level(style: str) -> int:
    if style == "Title":
        return 1
    match = _HEADING_STYLE.fullmatch(style)
    return min(int(match.group(1)), 6) if match else 0


def _docx_title(document: DocxDocument) -> str | None:
    titles = (p.text for p in document.paragraphs if _style_name(p) == "Title")
    return next((title for text in titles if (title := clean_title(text))), None)
