"""CSV and TSV: one sheet, a Markdown table whose header is the first row, rows cited by number.

The bytes are decoded as text files are (`decode_bytes`: BOM, UTF-8, else a detected
charset). A TSV is split on tabs; a CSV's delimiter is sniffed from its first lines among the
usual ones (`,` `;` tab `|`), else a comma. Rows are numbered as a spreadsheet numbers them
(the header is row 1; a blank line is a row too, left out of the table), so a chunk is cited
as `rows 12-40`. The one sheet has no name (the child that parses does not know the file's).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

from ingest.loaders.cleaning import decode_bytes
from ingest.loaders.markdown_text import MarkdownText, over_the_limit
from ingest.loaders.parsing import Parsed, bad_content
from ingest.loaders.tables import cell_text
from ragservice.limits.documents import DocumentLimits

_SNIFF_CHARS = 4096  # the Sniffer's regexes backtrack on long lines; a few lines suffice
_DELIMITERS = ",;\t|"


def parse_csv(data: bytes, limits: DocumentLimits) -> Parsed:
    text = decode_bytes(data)
    return _table(csv.reader(io.StringIO(text, newline=""), _dialect(text)), limits)


def parse_tsv(data: bytes, limits: DocumentLimits) -> Parsed:
    text = decode_bytes(data)
    return _table(csv.reader(io.StringIO(text, newline=""), csv.excel_tab), limits)


def _dialect(text: str) -> type[csv.Dialect]:
    sample = text[:_SNIFF_CHARS]
    if len(text) > _SNIFF_CHARS and "\n" in sample:
        sample = sample[: sample.rindex("\n")]  # whole lines only
    try:
        return csv.Sniffer().sniff(sample, delimiters=_DELIMITERS)
    except csv.Error:
        return csv.excel


def _table(records: Iterator[list[str]], limits: DocumentLimits) -> Parsed:
    header: list[str] | None = None
    rows: list[tuple[int, list[str]]] = []
    cost = 0
    with bad_content("not a valid CSV file"):
        for number, record in enumerate(records, start=1):
            cells = [cell_text(value) for value in record]
            while cells and not cells[-1]:
                cells.pop()
            if not cells:
                continue
            cost += sum(len(cell) + 3 for cell in cells)
            if cost > limits.max_chars:
                raise over_the_limit(limits)
            if header is None:
                header = cells
            else:
                rows.append((number, cells))
    if header is None:
        return Parsed("", None, "markdown")  # loading reports it (NO_TEXT)
    out = MarkdownText(limits)
    offsets = out.table(header, rows)
    numbered = tuple(zip(offsets, (number for number, _ in rows), strict=True))
    return Parsed(
        out.text(), None, "markdown", {"table_rows": len(rows)}, (0,), "sheet", ("",), numbered
    )
