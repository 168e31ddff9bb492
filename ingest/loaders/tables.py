"""Tables as Markdown table blocks, the one shape the chunker treats as a table.

The chunker keeps a table's rows whole and repeats its header in every chunk when it sees a
header line `| a | b |`, a separator line `| --- | --- |` and then one line per row; so every
loader that finds a table (PDF, DOCX) writes it through `markdown_table`. A cell's `|` is
escaped and its line breaks collapsed, or a cell would split the row.
"""

from __future__ import annotations

from collections.abc import Sequence

from ingest.loaders.cleaning import collapse


def markdown_table(rows: Sequence[Sequence[str | None]]) -> str:
    """The rows as a Markdown table, the first row its header; empty rows dropped, short rows
    padded. "" when fewer than two rows or two columns are left: that is no table."""
    cells = [[_cell(value) for value in row] for row in rows]
    cells = [row for row in cells if any(row)]
    width = max((len(row) for row in cells), default=0)
    if len(cells) < 2 or width < 2:
        return ""
    padded = [row + [""] * (width - len(row)) for row in cells]
    header, *body = padded
    lines = [_line(header), _line(["---"] * width), *(_line(row) for row in body)]
    return "\n".join(lines)


def _cell(value: str | None) -> str:
    return collapse(value or "").replace("|", "\\|")


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"
