"""DOCX: paragraphs, headings, lists and tables as Markdown; zip bombs are refused unopened."""

from __future__ import annotations

import io
import re
import zipfile

import docx
from docx.document import Document as DocxDocument
from docx.table import Table
from docx.text.paragraph import Paragraph

from ingest.loaders.cleaning import clean_text, clean_title, collapse
from ingest.loaders.parsing import Parsed, ParseError, bad_content
from ingest.loaders.tables import markdown_table
from ragservice.limits.documents import DocumentLimits

_HEADING_STYLE = re.compile(r"heading ([1-9])", re.I)
# A DOCX is a zip archive: refuse one that would unpack into far more than any real document.
# zipfile never reads past a member's declared size, so checking the declared sizes suffices.
_DOCX_MAX_MEMBERS = 10_000
_DOCX_MAX_UNPACKED = 256 * 2**20
_DOCX_MAX_RATIO = 200  # Deflate reaches about 1000:1 on zip bombs; XML rarely passes 20:1
_DOCX_RATIO_FROM = 2**20  # small members may compress however well they like
# The whole archive against the file's size, since many small members escape the check above
# (256 one-MiB members of zeros make 256 MiB from a 300 KB file). Ordinary DOCX XML packs 5 to
# 20:1 (python-docx's own template, mostly styles, 23:1), images and fonts about 1:1, so a real
# file stays far below 100:1, while deflate gives a bomb about 1000:1. At 100:1, unpacking the
# 256 MiB allowed above takes a file of 2.5 MiB or more; up to 1 MiB unpacks from any size.
_DOCX_MAX_TOTAL_RATIO = 100


def _check_archive(archive: zipfile.ZipFile, size: int) -> None:
    """Refuse an archive of `size` bytes that would unpack into far more than a document."""
    members = archive.infolist()
    if len(members) > _DOCX_MAX_MEMBERS:
        raise ParseError(f"refused: the archive has {len(members)} members (a zip bomb?)")
    unpacked = sum(member.file_size for member in members)
    if unpacked > _DOCX_MAX_UNPACKED:
        raise ParseError(f"refused: the archive unpacks to {unpacked} bytes (a zip bomb?)")
    for member in members:
        ratio = member.file_size / max(member.compress_size, 1)
        if member.file_size > _DOCX_RATIO_FROM and ratio > _DOCX_MAX_RATIO:
            raise ParseError(
                f"refused: {clean_text(member.filename)[:100]!r} is compressed {ratio:.0f}:1 "
                "(a zip bomb?)"
            )
    if unpacked > max(_DOCX_RATIO_FROM, _DOCX_MAX_TOTAL_RATIO * size):
        raise ParseError(
            f"refused: the DOCX unpacks to {unpacked / 2**20:.1f} MiB, more than "
            f"{_DOCX_MAX_TOTAL_RATIO} times its size (a zip bomb?)"
        )


def parse_docx(data: bytes, _limits: DocumentLimits) -> Parsed:
    with bad_content("not a valid DOCX file"):
        _check_archive(zipfile.ZipFile(io.BytesIO(data)), len(data))
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
