"""DOCX: paragraphs, headings, lists and tables as Markdown; zip bombs are refused unopened.

The body is walked in its XML rather than through python-docx's block iterator, which sees
only the paragraphs and tables directly in the body and so loses what Word wraps: content
controls (`w:sdt`: a cover page, a form field, a table of contents), custom XML, text boxes
(`w:txbxContent`, written after the paragraph that anchors them; their fallback copy for old
readers, under `mc:Fallback`, is left out) and tables nested in a table's cell (their cells'
text joins the outer cell's). A paragraph's text is every run in it, including those inside
hyperlinks, content controls, tracked insertions, simple fields and equations (OMML `m:t`,
as Word shows them, "x+a"); deleted text and field codes are left out.

Headers and footers are written once each (Word stores one per section, not one per page):
the headers' text before the body, the footers' after it, a text repeated between first-page,
even-page and default ones written once.
"""

from __future__ import annotations

import io
import itertools
import re
from collections.abc import Iterable, Iterator
from typing import Any

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
_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_M = "{http://schemas.openxmlformats.org/officeDocument/2006/math}"
_MC = "{http://schemas.openxmlformats.org/markup-compatibility/2006}"
_R = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"
_TEXT = {_W + "t", _M + "t"}
_BREAKS = {_W + "tab": "\t", _W + "br": "\n", _W + "cr": "\n", _W + "noBreakHyphen": "-"}
# Subtrees of a paragraph with no text of its own to give: deletions, moved-away text,
# properties, and text boxes (written as blocks of their own) with their fallback copies.
_NOT_TEXT = {_W + "del", _W + "moveFrom", _W + "rPr", _W + "pPr", _W + "txbxContent"}
_NOT_TEXT |= {_MC + "Fallback"}
_WRAPPERS = {_W + "sdt", _W + "sdtContent", _W + "customXml"}
_MARGINS = {_W + "headerReference": "header", _W + "footerReference": "footer"}
_Element = Any  # python-docx's lxml elements are untyped


def parse_docx(data: bytes, _limits: DocumentLimits) -> Parsed:
    with bad_content("not a valid DOCX file"):
        open_archive(data, "DOCX")  # refuses a zip bomb before python-docx unpacks it
        document = docx.Document(io.BytesIO(data))
        headers, footers = _margins(document)
        body = list(_blocks(document.element.body, document))
        title = clean_title(document.core_properties.title) or _docx_title(document)
    blocks = [block for block in [*headers, *body, *footers] if block]
    return Parsed(clean_text(_joined(blocks)), title, "markdown")


def _joined(blocks: list[str]) -> str:
    """The blocks separated by blank lines, but a list's items by line breaks only, so
    that the list reads (and chunks) as one list rather than as paragraphs."""
    parts = blocks[:1]
    for before, block in itertools.pairwise(blocks):
        in_list = before.startswith("- ") and block.startswith("- ")
        parts.append(("\n" if in_list else "\n\n") + block)
    return "".join(parts)


def _blocks(container: _Element, document: DocxDocument) -> Iterator[str]:
    """The Markdown blocks of a body, cell, text box, header or footer, in document order."""
    for child in container:
        if child.tag == _W + "p":
            yield _docx_paragraph(Paragraph(child, document))
            for box in _text_boxes(child):
                yield from _blocks(box, document)
        elif child.tag == _W + "tbl":
            yield _docx_table(Table(child, document))
        elif child.tag in _WRAPPERS:
            yield from _blocks(child, document)


def _text_boxes(paragraph: _Element) -> Iterator[_Element]:
    """The text boxes anchored in a paragraph (not those inside another box, which that box
    writes, nor the fallback copies)."""
    for box in paragraph.iter(_W + "txbxContent"):
        above = list(box.iterancestors())
        outer = above[: above.index(paragraph)]
        if not any(a.tag in (_W + "txbxContent", _MC + "Fallback") for a in outer):
            yield box


def paragraph_text(element: _Element) -> str:
    """A paragraph's text: its runs wherever they are nested (`_NOT_TEXT` left out)."""
    return "".join(_inline(element))


def _inline(element: _Element) -> Iterator[str]:
    for child in element:
        if child.tag in _TEXT:
            yield child.text or ""
        elif child.tag in _BREAKS:
            yield _BREAKS[child.tag]
        elif child.tag not in _NOT_TEXT:
            yield from _inline(child)


def _docx_paragraph(paragraph: Paragraph) -> str:
    text = paragraph_text(paragraph._p).strip()
    if not text:
        return ""
    style = _style_name(paragraph)
    level = _docx_heading_level(style)
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
            cells.append(_cell_text(cell._tc) if first else "")
        rows.append(cells)
    return markdown_table(rows) or "\n\n".join(text for row in rows for text in row if text)


def _cell_text(cell: _Element) -> str:
    """A cell's paragraphs on one line, those of tables nested in it and of its text boxes
    included (a Markdown cell cannot hold a table)."""
    paragraphs = (p for p in cell.iter(_W + "p") if not _in_fallback(p, cell))
    return collapse(" ".join(paragraph_text(p) for p in paragraphs))


def _in_fallback(element: _Element, top: _Element) -> bool:
    for above in element.iterancestors():
        if above is top:
            return False
        if above.tag == _MC + "Fallback":
            return True
    return False


def _margins(document: DocxDocument) -> tuple[list[str], list[str]]:
    """The blocks of the headers and of the footers, each part once and each text once, in
    the order the sections name them."""
    found: dict[str, list[str]] = {"header": [], "footer": []}
    parts = document.part.related_parts
    seen: set[str] = set()
    for reference in _margin_references(document.element.body):
        kind, part_id = _MARGINS[reference.tag], reference.get(_R + "id")
        if part_id in seen or part_id not in parts:
            continue
        seen.add(part_id)
        blocks = _blocks(parts[part_id].element, document)
        found[kind] += [b for b in blocks if b and b not in found[kind]]
    return found["header"], found["footer"]


def _margin_references(body: _Element) -> Iterable[_Element]:
    for section in body.iter(_W + "sectPr"):
        yield from (child for child in section if child.tag in _MARGINS)


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
