"""Tables as Markdown table blocks, the one shape the chunker treats as a table.

The chunker keeps a table's rows whole and repeats its header in every chunk when it sees a
header line `| a | b |`, a separator line `| --- | --- |` and then one line per row; so every
loader that finds a table writes it through this module: `markdown_table` (PDF, DOCX) or its
lines (`cell_text`, `table_line`, `separator_line`: slides, sheets, ODT). A cell's `|` is
escaped and its line breaks collapsed, or a cell would split the row.
"""

from __future__ import annotations

from collections.abc import Sequence

from ingest.loaders.cleaning import clean_text, collapse


def markdown_table(rows: Sequence[Sequence[str | None]]) -> str:
    """The rows as a Markdown table, the first row its header; empty rows dropped, short rows
    padded. "" when fewer than two rows or two columns are left: that is no table."""
    cells = [[cell_text(value or "") for value in row] for row in rows]
    cells = [row for row in cells if any(row)]
    width = max((len(row) for row in cells), default=0)
    if len(cells) < 2 or width < 2:
        return ""
    header, *body = cells
    lines = [table_line(header, width), separator_line(width)]
    return "\n".join(lines + [table_line(row, width) for row in body])


def cell_text(value: str) -> str:
    """One table cell: clean, on one line, its `|` escaped."""
    return collapse(clean_text(value)).replace("|", "\\|")


def table_line(cells: Sequence[str], width: int) -> str:
    """A table line of `width` cells (escaped already, `cell_text`), padded with empty ones."""
    padded = [*cells, *([""] * (width - len(cells)))]
    return "| " + " | ".join(padded) + " |"


def separator_line(width: int) -> str:
    return "|" + " --- |" * width
