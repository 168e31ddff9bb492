"""ODT (OpenDocument text): headings by outline level, paragraphs, lists and tables as Markdown.

odfpy parses the document's XML (a SAX parser, no tree of the whole archive) once the archive
has passed the zip-bomb check. The body is walked in order: `text:h` becomes a `#` heading of
its outline level, `text:p` a paragraph, a list's items `- ` lines indented by depth, a table
a Markdown table whose first row is the header; sections and the like are opened. A footnote
or endnote is written after the paragraph, list or table that cites it, as `[^2]: its text`
(inline it would cut the sentence that cites it). Comments (`office:annotation`) and
generated indexes (a table of contents, which repeats the headings) are left out, and
repeated empty cells and rows (ODF's `number-columns-repeated`) count once. The title is the
metadata's `dc:title`, else the first heading.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from typing import Any
from xml.parsers import expat

from odf.namespaces import DCNS, OFFICENS, TABLENS, TEXTNS
from odf.opendocument import load

from ingest.loaders.archives import open_archive
from ingest.loaders.cleaning import clean_text, clean_title, collapse
from ingest.loaders.markdown_text import MarkdownText
from ingest.loaders.parsing import Parsed, ParseError, bad_content
from ingest.loaders.tables import cell_text, separator_line, table_line
from ragservice.limits.documents import DocumentLimits

_TEXT_NODE = 3
_SKIPPED = {(OFFICENS, "annotation"), (TEXTNS, "note"), (TEXTNS, "tracked-changes")}
# Generated lists that repeat the document's own headings and entries.
_INDEXES = {(TEXTNS, "table-of-content"), (TEXTNS, "alphabetical-index")}
_INDEXES |= {(TEXTNS, "illustration-index"), (TEXTNS, "bibliography")}
_MAX_REPEAT = 64  # repeated cells or spaces written out at most this often
_Element = Any  # odfpy's elements are untyped


def parse_odt(data: bytes, limits: DocumentLimits) -> Parsed:
    with bad_content("not a valid ODT file"):
        archive = open_archive(data, "ODT")  # refuses a zip bomb before odfpy unpacks it
        _check_well_formed(archive)
        document = load(io.BytesIO(data))
        out = MarkdownText(limits)
        headings: list[str] = []
        for level, block in _blocks(document.text, 0):
            if level:
                out.heading(level, block)
                headings.append(block)
            else:
                out.add(block)
        title = clean_title(_meta_title(document.meta)) or clean_title(next(iter(headings), ""))
    return Parsed(out.text(), title, "markdown")


def _check_well_formed(archive: zipfile.ZipFile) -> None:
    """Refuse a body that is not well-formed XML: odfpy prints the error and goes on with the
    part it read before it, which would load half a document as if it were whole. expat (in
    C, no handlers, no tree) checks it quickly; expat 2.4 and later refuse entity bombs."""
    if "content.xml" in archive.namelist():
        parser = expat.ParserCreate()
        try:
            parser.Parse(archive.read("content.xml"), True)
        except expat.ExpatError as exc:
            raise ParseError(
                f"not a valid ODT file: its content.xml is malformed ({exc})"
            ) from None


def _blocks(element: _Element, depth: int) -> Iterator[tuple[int, str]]:
    """(heading level or 0, text) of each block under `element`, in document order."""
    for node in element.childNodes:
        name = getattr(node, "qname", None)
        block = _block(node, name, depth)
        if block is not None:
            yield block
            yield from ((0, note) for note in _notes(node))
        elif name not in _SKIPPED | _INDEXES and getattr(node, "nodeType", None) != _TEXT_NODE:
            yield from _blocks(node, depth)  # sections, frames, table:table-header-rows ...


def _block(node: _Element, name: object, depth: int) -> tuple[int, str] | None:
    """A heading, paragraph, list or table as (heading level or 0, text); None for others."""
    if name == (TEXTNS, "h"):
        level = _int(node.getAttrNS(TEXTNS, "outline-level"), 1)
        heading = collapse(_inline(node))
        return (min(max(level, 1), 6), heading) if heading else (0, "")
    if name == (TEXTNS, "p"):
        return 0, _inline(node).strip()
    if name == (TEXTNS, "list"):
        return 0, "\n".join(_list_lines(node, depth))
    if name == (TABLENS, "table"):
        return 0, _table(node)
    return None


def _notes(element: _Element) -> Iterator[str]:
    """The footnotes and endnotes cited in `element`, each `[^citation]: text`."""
    for note in _descendants(element, (TEXTNS, "note")):
        citation, body = "", ""
        for part in note.childNodes:
            if getattr(part, "qname", None) == (TEXTNS, "note-citation"):
                citation = collapse(_inline(part))
            elif getattr(part, "qname", None) == (TEXTNS, "note-body"):
                body = collapse(" ".join(text for _, text in _blocks(part, 0)))
        if body:
            yield f"[^{citation or '*'}]: {body}"


def _descendants(element: _Element, name: tuple[str, str]) -> Iterator[_Element]:
    """The elements called `name` under `element`, not those inside another of them."""
    for node in element.childNodes:
        if getattr(node, "qname", None) == name:
            yield node
        elif getattr(node, "childNodes", None):
            yield from _descendants(node, name)


def _list_lines(element: _Element, depth: int) -> Iterator[str]:
    """A list's items as `- ` lines, nested lists indented one step more."""
    for item in element.childNodes:
        if getattr(item, "qname", None) not in ((TEXTNS, "list-item"), (TEXTNS, "list-header")):
            continue
        for node in item.childNodes:
            if getattr(node, "qname", None) == (TEXTNS, "list"):
                yield from _list_lines(node, depth + 1)
            elif text := collapse(_inline(node)):
                yield "  " * depth + "- " + text


def _table(element: _Element) -> str:
    rows = [cells for cells in _rows(element) if any(cells)]
    if not rows:
        return ""
    width = max(len(cells) for cells in rows)
    lines = [table_line(rows[0], width), separator_line(width)]
    return "\n".join(lines + [table_line(cells, width) for cells in rows[1:]])


def _rows(element: _Element) -> Iterator[list[str]]:
    for node in element.childNodes:
        name = getattr(node, "qname", None)
        if name == (TABLENS, "table-row"):
            yield _cells(node)
        elif name in ((TABLENS, "table-header-rows"), (TABLENS, "table-rows")):
            yield from _rows(node)


def _cells(row: _Element) -> list[str]:
    cells: list[str] = []
    for node in row.childNodes:
        if getattr(node, "qname", None) not in (
            (TABLENS, "table-cell"),
            (TABLENS, "covered-table-cell"),
        ):
            continue
        value = cell_text(_inline(node))
        repeat = _int(node.getAttrNS(TABLENS, "number-columns-repeated"), 1)
        cells += [value] * (min(repeat, _MAX_REPEAT) if value else 1)
    while cells and not cells[-1]:
        cells.pop()
    return cells


def _inline(element: _Element) -> str:
    """The text of an element: its text nodes, spaces (`text:s`), tabs and line breaks;
    comments and footnotes left out. Cleaned once, whole: a space or tab at the edge of a
    span (`maxreq<text:tab/></text:span>3`) separates words, and cleaning each span would
    strip it."""
    return clean_text("".join(_inline_parts(element)))


def _inline_parts(element: _Element) -> Iterator[str]:
    for node in element.childNodes:
        name = getattr(node, "qname", None)
        if getattr(node, "nodeType", None) == _TEXT_NODE:
            yield str(node.data)
        elif name == (TEXTNS, "s"):
            yield " " * min(_int(node.getAttrNS(TEXTNS, "c"), 1), _MAX_REPEAT)
        elif name == (TEXTNS, "tab"):
            yield "\t"
        elif name == (TEXTNS, "line-break"):
            yield "\n"
        elif name not in _SKIPPED:
            yield from _inline_parts(node)


def _meta_title(meta: _Element) -> str:
    titles = [node for node in meta.childNodes if getattr(node, "qname", None) == (DCNS, "title")]
    return _inline(titles[0]) if titles else ""


def _int(value: object, default: int) -> int:
    try:
        return int(str(value)) if value is not None else default
    except ValueError:
        return default
