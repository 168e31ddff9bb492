"""XLSX: each sheet a `# <name>` heading and a Markdown table, its rows cited by their numbers.

openpyxl reads the workbook read-only (streaming the sheet XML rather than building every
cell) with `data_only=True`, so a formula gives the value Excel cached when it saved the file,
not its formula text. A sheet's table header is its first non-empty row; every later non-empty
row is one table line, and `row_starts` keeps the line's offset with the row's real number in
the sheet, so a chunk can be cited as `sheet "Q3", rows 12-40`. Columns empty in every row
(a table that starts at column C) are left out.

The sheets are read with their dimensions reset: a file's declared dimension can be wrong
(some writers say `A1` for any sheet), and read-only openpyxl would trust it and cut rows
short. The work is bounded as the rows stream: a sheet whose cells come to more than the
character limit stops the parse at once.
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Iterable, Sequence

import openpyxl
from openpyxl.workbook.workbook import Workbook

from ingest.loaders.archives import open_archive
from ingest.loaders.cleaning import clean_title
from ingest.loaders.markdown_text import MarkdownText, over_the_limit, too_many_pages
from ingest.loaders.parsing import Parsed, bad_content
from ingest.loaders.tables import cell_text
from ragservice.limits.documents import DocumentLimits

_Row = tuple[int, list[str]]  # (row number in the sheet, its cells' texts)


def parse_xlsx(data: bytes, limits: DocumentLimits) -> Parsed:
    with bad_content("not a valid XLSX file"):
        open_archive(data, "XLSX")  # refuses a zip bomb before openpyxl unpacks it
        book = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
        try:
            return _workbook(book, limits)
        finally:
            book.close()


def _workbook(book: Workbook, limits: DocumentLimits) -> Parsed:
    sheets = book.worksheets
    if len(sheets) > limits.max_pages:
        raise too_many_pages(len(sheets), "sheets", limits)
    out = MarkdownText(limits)
    starts: list[int] = []
    rows: list[tuple[int, int]] = []
    for sheet in sheets:
        starts.append(out.heading(1, sheet.title))
        sheet.reset_dimensions()
        numbered = _rows(sheet.iter_rows(values_only=True), limits)
        if numbered:
            header, *body = _without_empty_columns(numbered)
            offsets = out.table(header[1], body)
            rows += zip(offsets, (number for number, _ in body), strict=True)
    names = tuple(sheet.title for sheet in sheets)
    title = clean_title(book.properties.title)
    metadata = {"sheets": len(sheets)}
    return Parsed(
        out.text(), title, "markdown", metadata, tuple(starts), "sheet", names, tuple(rows)
    )


def _rows(values: Iterable[Sequence[object]], limits: DocumentLimits) -> list[_Row]:
    """The sheet's non-empty rows with their numbers (1-based), each without its trailing empty
    cells; fails as soon as they would make more text than the limit (each cell costs at least
    the three characters that separate it in a table line)."""
    rows: list[_Row] = []
    cost = 0
    for number, row in enumerate(values, start=1):
        cells = [cell_text(_rendered(value)) for value in row]
        while cells and not cells[-1]:
            cells.pop()
        if not cells:
            continue
        cost += sum(len(cell) + 3 for cell in cells)
        if cost > limits.max_chars:
            raise over_the_limit(limits)
        rows.append((number, cells))
    return rows


def _without_empty_columns(rows: list[_Row]) -> list[_Row]:
    """The rows without the columns that are empty in all of them."""
    width = max(len(cells) for _, cells in rows)
    used = [i for i in range(width) if any(i < len(cells) and cells[i] for _, cells in rows)]
    return [(number, [cells[i] if i < len(cells) else "" for i in used]) for number, cells in rows]


def _rendered(value: object) -> str:
    """A cell's value as a person reads it: whole numbers without `.0`, dates in ISO form (a
    date alone when the time is midnight), booleans as Excel shows them."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)
    if isinstance(value, dt.datetime):
        return value.date().isoformat() if value.time() == dt.time() else value.isoformat(" ")
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    return str(value)
