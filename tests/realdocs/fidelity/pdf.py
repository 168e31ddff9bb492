"""PDF fidelity: the loader's text of each real PDF against pdftotext's and pdfium's, page by
page; glued words; reading order on two-column pages; hand-transcribed table cells.

- Words: recall and precision (`words.word_score`) against `pdftotext -layout`, whose text is
  kept in `pdf/reference/` (`sources.py references`), and against pypdfium2's own text of the
  page. Only text pages count (at least `TEXT_PAGE_WORDS` words in the reference).
- Running headers and footers (a page's first or last line, its digits masked, repeated on
  `repeats` pages or more) and the entries of a table of contents or an index (a line that
  runs to a page number through dot leaders) are taken out of the references: the loader
  leaves them out on purpose (the document's furniture and navigation, not its content).
- Glued runs: `words.glued_runs` against pdftotext's words of the whole file.
- Reading order: on the pages `truth.toml` names as two-column (all made by TeX, which writes
  a page's lines in reading order: a column's lines, then the next column's, floats where it
  placed them), the sentences of the page's text in the order the file stores it (pdfium's
  text, running headers and footers out): how many the loader's page has word for word, and
  how many of those in order (`words.in_order`). pdftotext's reading order is no reference:
  around equations and floats it reads parts of the right column before the left one ends.
- Tables: each table of `truth.toml`, transcribed by hand, against the loader's Markdown tables
  on its page: the share of its cells found at their row and column (rows aligned at the best
  offset: a table may gain or lose a caption line).
"""

from __future__ import annotations

import math
import re
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pypdfium2

from ingest.loaders.pdf.text import LEADERS
from tests.realdocs.fidelity.words import (
    NO_WORDS,
    Order,
    WordScore,
    glued_runs,
    in_order,
    sentences,
    total,
    word_score,
    words,
)
from tests.realdocs.sources import ROOT, sources

TEXT_PAGE_WORDS = 20
PDF_FOLDER = ROOT / "pdf"
REFERENCE = PDF_FOLDER / "reference"
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class Truth:
    two_column: dict[str, list[int]]
    tables: list[dict[str, Any]]


def truth() -> Truth:
    path = PDF_FOLDER / "truth.toml"
    data = tomllib.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    columns = {entry["name"]: list(entry["pages"]) for entry in data.get("two_column", [])}
    return Truth(columns, list(data.get("table", [])))


def pdf_names() -> list[str]:
    return [source.name for source in sources(("pdf",))]


def reference_pages(name: str) -> list[str]:
    """pdftotext's `-layout` text of each page."""
    text = (REFERENCE / f"{Path(name).stem}.layout.txt").read_text(encoding="utf-8")
    pages = text.split("\f")
    return pages[:-1] if pages and not pages[-1].strip() else pages


def pdfium_pages(data: bytes) -> list[str]:
    document = pypdfium2.PdfDocument(data)
    try:
        pages: list[str] = []
        for index in range(len(document)):
            text_page = document[index].get_textpage()
            pages.append(text_page.get_text_range())
            text_page.close()
        return pages
    finally:
        document.close()


def our_pages(text: str, starts: Sequence[int], count: int) -> list[str]:
    """The loader's text cut at its pages' starts (`Parsed.page_starts`)."""
    bounds = [*starts, len(text)]
    pages = [text[bounds[i] : bounds[i + 1]] for i in range(len(starts))]
    return pages + [""] * (count - len(pages))


# -- running headers and footers ---------------------------------------------------------------


def _margin_key(line: str) -> str:
    return " ".join(_DIGITS.sub("#", line).split()).casefold()


def _edge_lines(page: str) -> list[str]:
    lines = [line for line in page.splitlines() if line.strip()]
    return lines[:1] + lines[-1:] if len(lines) > 1 else lines


def repeats(pages: int) -> int:
    """On how many pages a margin line must recur to be a running header or footer."""
    return max(2, math.ceil(pages / 4))


def margin_keys(pages: Sequence[str]) -> set[str]:
    counts = Counter(key for page in pages for key in {_margin_key(x) for x in _edge_lines(page)})
    return {key for key, count in counts.items() if count >= repeats(len(pages))}


def without_margins(page: str, keys: set[str]) -> str:
    """The page less its first and last lines where they are running headers or footers, and
    less the entries of a contents or an index (`LEADERS`)."""
    lines = page.splitlines()
    filled = [i for i, line in enumerate(lines) if line.strip()]
    edges = {filled[0], filled[-1]} if filled else set()
    return "\n".join(
        line
        for i, line in enumerate(lines)
        if not (i in edges and _margin_key(line) in keys) and not LEADERS.search(line)
    )


# -- tables ------------------------------------------------------------------------------------


def markdown_tables(text: str) -> list[list[list[str]]]:
    """The Markdown tables in `text`: rows of cells, the separator row left out."""
    tables: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        stripped = line.strip()
        if stripped.startswith("|") and stripped.endswith("|") and len(stripped) > 1:
            cells = [c.replace("\\|", "|") for c in re.split(r"(?<!\\)\|", stripped[1:-1])]
            if not all(set(c.strip()) <= {"-"} and c.strip() for c in cells):
                current.append([c.strip() for c in cells])
        elif current:
            tables.append(current)
            current = []
    return tables


def _cell(text: str) -> str:
    return " ".join(words(text))


def cell_accuracy(hand: Sequence[Sequence[str]], found: Sequence[Sequence[str]]) -> int:
    """How many of the hand-transcribed cells the found table has at their row and column,
    rows aligned at the best offset."""
    best = 0
    for offset in range(-len(found), len(found) + 1):
        hits = 0
        for i, row in enumerate(hand):
            j = i + offset
            if 0 <= j < len(found):
                theirs = found[j]
                hits += sum(
                    1
                    for k, cell in enumerate(row)
                    if k < len(theirs) and _cell(cell) == _cell(theirs[k])
                )
        best = max(best, hits)
    return best


# -- the measure -------------------------------------------------------------------------------


@dataclass
class PdfFidelity:
    name: str
    pages: int
    text_pages: int = 0
    seconds: float = 0.0
    against_pdftotext: WordScore = NO_WORDS
    against_pdfium: WordScore = NO_WORDS
    worst_pages: list[tuple[int, float, float]] = field(default_factory=list)
    glued: list[str] = field(default_factory=list)
    order: Order = field(default_factory=lambda: Order(0, 0, 0))
    table_cells: int = 0
    table_cells_found: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "file": self.name,
            "pages": self.pages,
            "text_pages": self.text_pages,
            "seconds_per_page": round(self.seconds / max(1, self.pages), 4),
            "words": self.against_pdftotext.reference,
            "recall": round(self.against_pdftotext.recall, 4),
            "precision": round(self.against_pdftotext.precision, 4),
            "recall_pdfium": round(self.against_pdfium.recall, 4),
            "precision_pdfium": round(self.against_pdfium.precision, 4),
            "glued_runs": len(self.glued),
            "order_sentences": self.order.sentences,
            "order_found": self.order.found,
            "order_in_place": self.order.in_place,
            "table_cells": self.table_cells,
            "table_cells_found": self.table_cells_found,
        }


Reader = Callable[[bytes], tuple[list[str], float]]
"""A PDF reader under test: the file's bytes to its pages' texts, and the seconds it took."""


def loader_reader(limits: Any = None) -> Reader:
    """This project's loader (`ingest.loaders.pdf.parse_pdf`), OCR off."""
    from ingest.loaders.pdf import parse_pdf
    from ragservice.limits.documents import DocumentLimits

    bounds = limits or DocumentLimits(max_pages=2000, max_chars=50_000_000, ocr="off")

    def read(data: bytes) -> tuple[list[str], float]:
        started = time.perf_counter()
        parsed = parse_pdf(data, bounds)
        seconds = time.perf_counter() - started
        count = int(parsed.metadata.get("pages", len(parsed.page_starts)))
        return our_pages(parsed.text, parsed.page_starts, count), seconds

    return read


def measure(name: str, read: Reader, the_truth: Truth | None = None) -> PdfFidelity:
    """Every measure of one corpus PDF, read by `read`."""
    data = (PDF_FOLDER / name).read_bytes()
    layout = reference_pages(name)
    pdfium = pdfium_pages(data)
    ours, seconds = read(data)
    result = PdfFidelity(name, len(layout), seconds=seconds)
    layout_keys, pdfium_keys = margin_keys(layout), margin_keys(pdfium)
    page_scores: list[WordScore] = []
    pdfium_scores: list[WordScore] = []
    for index, reference in enumerate(layout):
        reference_words = words(without_margins(reference, layout_keys))
        if len(reference_words) < TEXT_PAGE_WORDS:
            continue
        mine = words(ours[index]) if index < len(ours) else []
        score = word_score(mine, reference_words)
        page_scores.append(score)
        theirs = words(without_margins(pdfium[index], pdfium_keys)) if index < len(pdfium) else []
        pdfium_scores.append(word_score(mine, theirs))
        result.worst_pages.append((index + 1, score.recall, score.precision))
    result.text_pages = len(page_scores)
    result.against_pdftotext = total(page_scores)
    result.against_pdfium = total(pdfium_scores)
    result.worst_pages.sort(key=lambda page: min(page[1], page[2]))
    result.glued = glued_runs("\n".join(ours), "\n".join(layout))
    the_truth = the_truth or truth()
    _order(result, name, ours, pdfium, the_truth)
    _tables(result, name, ours, the_truth)
    return result


def _order(
    result: PdfFidelity, name: str, ours: Sequence[str], pdfium: Sequence[str], the_truth: Truth
) -> None:
    pages = without_furniture(pdfium)
    for page in the_truth.two_column.get(name, []):
        result.order += in_order(ours[page - 1], sentences(pages[page - 1]))


def without_furniture(pages: Sequence[str]) -> list[str]:
    """The pages less every line that recurs (digits masked) on `repeats` pages or more,
    wherever on the page the file stores it: in a file's own order a running header or a
    "draft" stamp may come anywhere."""
    counts = Counter(key for page in pages for key in {_margin_key(x) for x in page.splitlines()})
    furniture = {key for key, n in counts.items() if key and n >= repeats(len(pages))}
    return [
        "\n".join(x for x in page.splitlines() if _margin_key(x) not in furniture) for page in pages
    ]


def _tables(result: PdfFidelity, name: str, ours: Sequence[str], the_truth: Truth) -> None:
    for table in the_truth.tables:
        if table["name"] != name:
            continue
        hand = table["rows"]
        result.table_cells += sum(len(row) for row in hand)
        found = markdown_tables(ours[table["page"] - 1])
        result.table_cells_found += max((cell_accuracy(hand, t) for t in found), default=0)


def measure_all(read: Reader, names: Iterable[str] | None = None) -> list[PdfFidelity]:
    the_truth = truth()
    return [measure(name, read, the_truth) for name in (names or pdf_names())]
