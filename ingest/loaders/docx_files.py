"""DOCX: paragraphs, headings, lists and tables as Markdown; zip bombs are refused unopened."""

from __future__ import annotations

import io
import re

import docx
from docx.document import Document as DocxDocument
from docx.table import Table
from docx.text.paragraph import Paragraph

from ingest.loaders.archives import open_archive
from ingest.loaders.cleaning import clean_text, clean_title, collapse
from ingest.loaders.parsing import Parsed, bad_content
from ingest.loaders.tables import markdown_table
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
        return _docx_table(item)
    text = item.text.strip()
    style = _style_name(item)
    level = _docx_heading_level(style)
    if not text:
        return ""
    if level:
        return "#" * level + " " + collapse(text)
    return "- " + text if style.startswith("List") else text


def _docx_table(table: Table) -> str:
    """A Markdown table, its first row the header. A merged cell's text comes once, in its
    first row and column (python-docx returns it for every grid cell it covers), so the
    columns stay aligned. A table of one row or one column (a box around text) is paragraphs."""
    seen: set[object] = set()  # the cells' elements, kept alive so identity holds
    rows: list[list[str]] = []
    for row in table.rows:
        cells: list[str] = []
        for cell in row.cells:
            first = cell._tc not in seen
            seen.add(cell._tc)
            cells.append(collapse(cell.text) if first else "")
        rows.append(cells)
    return markdown_table(rows) or "\n\n".join(text for row in rows for text in row if text)


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
