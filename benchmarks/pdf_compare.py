"""Which PDF library reads tables and two-column pages best, and how fast: pypdf, pdfplumber
and pypdfium2's text on the same generated files (tests/corpus_pdf.py), plus this project's
loader (ingest.loaders.pdf: pdfium's words and strokes) for reference.

Scores, per library:
- table_rows_in_order: the fraction of table rows (ruled and unruled tables) whose cells come
  back in order on one line, the rows themselves in order; table_cells_delimited: the same,
  counting only rows whose cells are told apart (`|`, a tab, two spaces), as a table needs;
- two_column: the fraction of the two-column page's six sentences (its lines written across
  the page, left then right at each height) that come back whole and in
  reading order (left column, then right); `two_column_ok` is true when all do;
- seconds_per_page: reading 40 pages of prose; seconds_per_table_page: a 600-row ruled table
  (13 pages: the loader reads these with pdfplumber, which finds ruled tables).

    .venv/bin/python benchmarks/pdf_compare.py

The last line printed is JSON.
"""

from __future__ import annotations

import io
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pdfplumber
import pypdfium2
from pypdf import PdfReader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ingest.loaders.pdf import parse_pdf
from ragservice.limits.documents import DocumentLimits
from tests import corpus_pdf

Reader = Callable[[bytes], str]
_LIMITS = DocumentLimits(max_pages=1000, max_chars=10_000_000, ocr="off")


def read_pypdf(data: bytes) -> str:
    return "\n".join(page.extract_text() or "" for page in PdfReader(io.BytesIO(data)).pages)


def read_pdfplumber(data: bytes) -> str:
    with pdfplumber.open(io.BytesIO(data)) as pdf:
        return "\n".join(page.extract_text() or "" for page in pdf.pages)


def read_pdfplumber_tables(data: bytes) -> str:
    """pdfplumber's text, and its ruled tables (lines strategy) a row a line, cells by `|`."""
    out: list[str] = []
    with pdfplumber.open(io.BytesIO(data)) as pdf:
        for page in pdf.pages:
            out.append(page.extract_text() or "")
            for table in page.extract_tables({"vertical_strategy": "lines"}):
                out.extend(" | ".join(cell or "" for cell in row) for row in table)
    return "\n".join(out)


def read_pdfium(data: bytes) -> str:
    document = pypdfium2.PdfDocument(data)
    try:
        return "\n".join(page.get_textpage().get_text_range() for page in document)
    finally:
        document.close()


def read_loader(data: bytes) -> str:
    return parse_pdf(data, _LIMITS).text


READERS: dict[str, Reader] = {
    "pypdf": read_pypdf,
    "pdfplumber": read_pdfplumber,
    "pdfplumber+tables": read_pdfplumber_tables,
    "pypdfium2": read_pdfium,
    "loader": read_loader,
}


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def table_score(text: str, rows: Sequence[Sequence[str]], delimited: bool) -> float:
    """Rows found with their cells in order on one line, after the row before; `delimited`:
    only where the cells are told apart (by `|`, a tab or two spaces), not merely adjacent."""
    lines = text.splitlines()
    found, at = 0, 0
    between = r"\s*(?:\||\t|\s{2})\s*" if delimited else r"\W*"
    for row in rows:
        pattern = re.compile(between.join(re.escape(cell) for cell in row) + r"\b")
        hit = next((i for i in range(at, len(lines)) if pattern.search(lines[i])), None)
        if hit is not None:
            found, at = found + 1, hit + 1
    return found / len(rows)


def order_score(text: str, sentences: list[str]) -> float:
    """Sentences found whole (whitespace aside), each after the one before."""
    flat, at, found = _normal(text), 0, 0
    for sentence in sentences:
        where = flat.find(sentence, at)
        if where >= 0:
            found, at = found + 1, where + len(sentence)
    return found / len(sentences)


def joined(parts: Sequence[bytes]) -> bytes:
    from pypdf import PdfWriter

    writer = PdfWriter()
    for part in parts:
        writer.append(io.BytesIO(part))
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def seconds_per_page(read: Reader, data: bytes) -> float:
    pages = len(PdfReader(io.BytesIO(data)).pages)
    started = time.perf_counter()
    read(data)
    return (time.perf_counter() - started) / pages


def main() -> None:
    rows: list[Sequence[str]] = [corpus_pdf.TABLE_HEADER, *corpus_pdf.TABLE_ROWS]
    tables = [corpus_pdf.table_pdf(ruled=True), corpus_pdf.table_pdf(ruled=False)]
    columns = corpus_pdf.two_column_pdf()
    sentences = corpus_pdf.LEFT_COLUMN + corpus_pdf.RIGHT_COLUMN
    prose = joined([corpus_pdf.paragraph_pdf()] * 40)
    ruled = corpus_pdf.long_table_pdf(600)
    result: dict[str, object] = {}
    for name, read in READERS.items():
        texts = [read(data) for data in tables]
        loose = sum(table_score(text, rows, delimited=False) for text in texts) / len(texts)
        cells = sum(table_score(text, rows, delimited=True) for text in texts) / len(texts)
        order = order_score(read(columns), sentences)
        result[name] = {
            "table_rows_in_order": round(loose, 3),
            "table_cells_delimited": round(cells, 3),
            "two_column": round(order, 3),
            "two_column_ok": order == 1.0,
            "seconds_per_page": round(seconds_per_page(read, prose), 4),
            "seconds_per_table_page": round(seconds_per_page(read, ruled), 4),
        }
        print(f"{name:>10}: {result[name]}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
