"""XLSX: each sheet a `# <name>` heading and a Markdown table, its rows cited by their numbers.

openpyxl reads the workbook read-only (streaming the sheet XML rather than building every
cell) with `data_only=True`, so a formula gives the value Excel cached when it saved the file,
not its formula text. Every non-empty row below the table's header is one table line, and
`row_starts` keeps the line's offset with the row's real number in the sheet, so a chunk can
be cited as `sheet "Q3", rows 12-40`. Columns empty in every row (a table that starts at
column C) are left out.

The header is what the chunker repeats above every chunk of rows, so it should be the row
that names the columns (`_header_at`): usually the first row; but people write a title and
notes above their tables, and a header of "Lots of people" above every chunk would name
nothing. So when the first row fills no more than half of the columns, and the rows that
come before the first row holding a number, date or boolean end in rows that fill most of
the columns with text, the first of those is the header, and the rows above it are written
as lines of text before the table. A sheet whose first row holds no text at all (numbers from
the first row on) has no header row: its columns' letters head the table, and its first row is
a table line, cited by its number, like the others.

The sheets are read with their dimensions reset: a file's declared dimension can be wrong
(some writers say `A1` for any sheet), and read-only openpyxl would trust it and cut rows
short. The work is bounded as the rows stream: a sheet whose cells come to more than the
character limit stops the parse at once.
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import openpyxl
from openpyxl.utils import get_column_letter
from openpyxl.workbook.workbook import Workbook

from ingest.loaders.archives import open_archive
from ingest.loaders.cleaning import clean_title
from ingest.loaders.markdown_text import MarkdownText, over_the_limit, too_many_pages
from ingest.loaders.parsing import Parsed, bad_content
from ingest.loaders.tables import cell_text
from ragservice.limits.documents import DocumentLimits

_HEADER_SEARCH = 20  # a header this far below the sheet's first row is no header


@dataclass(frozen=True)
class _Row:
    number: int
    """The row's number in the sheet (1-based)."""
    cells: list[str]
    """Its cells' texts, escaped for a table line."""
    texts: int
    """How many of its cells hold text (the others are empty, or numbers, dates, booleans)."""

    @property
    def filled(self) -> int:
        return sum(1 for cell in self.cells if cell)


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
            rows += _sheet_table(out, numbered)
    names = tuple(sheet.title for sheet in sheets)
    title = clean_title(book.properties.title)
    metadata = {"sheets": len(sheets)}
    return Parsed(
        out.text(), title, "markdown", metadata, tuple(starts), "sheet", names, tuple(rows)
    )


def _sheet_table(out: MarkdownText, rows: list[_Row]) -> list[tuple[int, int]]:
    """Write a sheet's rows: the lines above its header, then its table; (offset, row number)
    of each table line."""
    columns, rows = _without_empty_columns(rows)
    at = _header_at(rows, len(columns))
    if at is None:
        header, body = [get_column_letter(column + 1) for column in columns], rows
    else:
        header, body = rows[at].cells, rows[at + 1 :]
        out.add("\n".join(" ".join(cell for cell in row.cells if cell) for row in rows[:at]))
    offsets = out.table(header, [(row.number, row.cells) for row in body])
    return list(zip(offsets, (row.number for row in body), strict=True))


def _header_at(rows: Sequence[_Row], width: int) -> int | None:
    """Which row heads the table (see the module's notes); None when none does (the first
    row holds no text)."""
    if rows[0].texts == 0:
        return None
    if 2 * rows[0].filled > width:
        return 0  # a first row across most columns is the header, even of rows of text
    values = (i for i, row in enumerate(rows[:_HEADER_SEARCH]) if row.texts < row.filled)
    first_value = next(values, 0)
    at = first_value
    while at > 0 and 2 * rows[at - 1].filled > width and rows[at - 1].texts:
        at -= 1
    return at if at < first_value else 0


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
        texts = sum(1 for value in row if isinstance(value, str) and value.strip())
        rows.append(_Row(number, cells, texts))
    return rows


def _without_empty_columns(rows: list[_Row]) -> tuple[list[int], list[_Row]]:
    """The columns (0-based) used in any of the rows, and the rows without the others."""
    width = max(len(row.cells) for row in rows)
    used = [i for i in range(width) if any(i < len(row.cells) and row.cells[i] for row in rows)]
    kept = [
        _Row(row.number, [row.cells[i] if i < len(row.cells) else "" for i in used], row.texts)
        for row in rows
    ]
    return used, kept


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
