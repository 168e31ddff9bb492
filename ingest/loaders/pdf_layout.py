"""A PDF page's words in reading order, with its tables as Markdown tables.

`pdf_words` gives each word's box (pdfium, or pdfplumber where lines are drawn). From them:

- ruled tables (cells drawn with lines) are found by pdfplumber's lines strategy; their words
  leave the running text and the table is written at its place;
- the words are grouped into lines; a page with a vertical gutter that most lines do not cross,
  each side of it filled by one run of prose per line, is read as two columns: left column,
  then right, between any lines or tables that span the gutter (a title, a wide table);
- unruled tables are found conservatively in what is left: at least three consecutive lines
  split by wide gaps into the same number (two or more) of parts, each part aligned (left,
  right or centre) with the same part of the other lines. pdfplumber's own text strategy
  finds "tables" in ordinary paragraphs, so it is not used;
- lines are joined by a newline, by a blank line where the gap above a line is wider than a
  line's spacing (a paragraph break).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ingest.loaders.tables import markdown_table

_RULED = {"vertical_strategy": "lines", "horizontal_strategy": "lines"}
_ALIGN_TOLERANCE = 2.5  # points: how far the edges of one column's parts may wander
_MIN_TABLE_ROWS = 3
_GUTTER_MIN_WIDTH = 8.0  # points
_GUTTER_KEPT = 0.7  # the share of lines that must not cross a gutter
_COLUMN_FILL = 0.7  # a full line of a column fills this much of its width, at least ...
_FULL_LINES = 0.4  # ... and this share of a column's lines are full (the others end paragraphs)
_FAR = 20_000.0  # points (7 m): coordinates beyond are no page's, and would cost memory
_MAX_WORDS_PER_CELL = 5  # on average, in an unruled table
_LIST_MARKERS = frozenset("\u2022\u2023\u25e6\u25aa\u2013\u2014-*\u00b7")  # bullets, dashes


@dataclass(frozen=True)
class Word:
    text: str
    x0: float
    x1: float
    top: float
    bottom: float


@dataclass(frozen=True)
class Line:
    words: tuple[Word, ...]

    @property
    def x0(self) -> float:
        return self.words[0].x0

    @property
    def x1(self) -> float:
        return max(word.x1 for word in self.words)

    @property
    def top(self) -> float:
        return min(word.top for word in self.words)

    @property
    def bottom(self) -> float:
        return max(word.bottom for word in self.words)

    @property
    def height(self) -> float:
        return statistics.median(word.bottom - word.top for word in self.words)

    @property
    def text(self) -> str:
        return " ".join(word.text for word in self.words)


@dataclass(frozen=True)
class Table:
    markdown: str
    x0: float
    x1: float
    top: float
    bottom: float

    def holds(self, word: Word) -> bool:
        """Whether the middle of `word` is inside the table (its words are its cells)."""
        middle_x, middle_y = (word.x0 + word.x1) / 2, (word.top + word.bottom) / 2
        return self.x0 <= middle_x <= self.x1 and self.top <= middle_y <= self.bottom


Item = Line | Table


@dataclass(frozen=True)
class PageText:
    text: str
    tables: int


def lay_out(words: Sequence[Word], tables: Sequence[Table] = ()) -> PageText:
    """The page's text in reading order from its words (`pdf_words`) and ruled tables."""
    kept = [word for word in words if all(-_FAR < v < _FAR for v in _box(word))]
    items: list[Item] = [*tables, *_group_lines(kept)]
    flows = _reading_order(items)
    found = len(tables)
    parts: list[str] = []
    for flow in flows:
        blocks = _find_unruled(flow)
        found += sum(isinstance(block, Table) for block in blocks)
        parts.append(_render(blocks))
    return PageText("\n\n".join(part for part in parts if part), found)


def _box(word: Word) -> tuple[float, float, float, float]:
    return word.x0, word.x1, word.top, word.bottom


def ruled_tables(page: Any) -> list[Table]:
    """The tables pdfplumber finds from the lines drawn on `page` (a pdfplumber page)."""
    found: list[Table] = []
    for table in page.find_tables(_RULED):
        markdown = markdown_table(table.extract())
        if markdown:
            x0, top, x1, bottom = table.bbox
            found.append(Table(markdown, float(x0), float(x1), float(top), float(bottom)))
    return found


def _group_lines(words: Iterable[Word]) -> list[Line]:
    """Words whose boxes overlap vertically by half the smaller height share a line."""
    lines: list[list[Word]] = []
    top = bottom = 0.0  # the current line's extent, kept as it grows
    for word in sorted(words, key=lambda w: (w.top, w.x0)):
        overlap = min(bottom, word.bottom) - max(top, word.top)
        if lines and overlap >= 0.5 * min(bottom - top, word.bottom - word.top):
            lines[-1].append(word)
            top, bottom = min(top, word.top), max(bottom, word.bottom)
        else:
            lines.append([word])
            top, bottom = word.top, word.bottom
    return [Line(tuple(sorted(line, key=lambda w: w.x0))) for line in lines]


# -- columns ---------------------------------------------------------------------------------


def _reading_order(items: list[Item]) -> list[list[Item]]:
    """The items as flows, each read top down: one flow for a single-column page; for two
    columns, per stretch between items spanning the gutter, the left flow then the right."""
    by_top = sorted(items, key=lambda item: (item.top, item.x0))
    gutter = _gutter([item for item in by_top if isinstance(item, Line)])
    if gutter is None:
        return [by_top]
    flows: list[list[Item]] = []
    spanning: list[Item] = []
    left: list[Item] = []
    right: list[Item] = []
    for item in by_top:
        parts = _split(item, *gutter)
        if parts is None:
            flows.extend(flow for flow in (left, right) if flow)
            left, right = [], []
            spanning.append(item)
        else:
            if spanning:
                flows.append(spanning)
                spanning = []
            left.extend(parts[0])
            right.extend(parts[1])
    flows.extend(flow for flow in (spanning, left, right) if flow)
    return flows


def _split(item: Item, left_edge: float, right_edge: float) -> tuple[list[Item], list[Item]] | None:
    """The item's parts left and right of the gutter; None if it crosses the gutter."""
    if isinstance(item, Table):
        if item.x1 <= right_edge:
            return [item], []
        if item.x0 >= left_edge:
            return [], [item]
        return None
    if any(word.x0 < right_edge and word.x1 > left_edge for word in item.words):
        return None
    left = tuple(word for word in item.words if word.x1 <= left_edge)
    right = tuple(word for word in item.words if word.x0 >= right_edge)
    return ([Line(left)] if left else []), ([Line(right)] if right else [])


def _gutter(lines: Sequence[Line]) -> tuple[float, float] | None:
    """The widest vertical band in the middle of the text crossed by the fewest lines, if
    most lines do not cross it and both its sides read as columns of prose; None for a
    single-column page."""
    if len(lines) < 2 * _MIN_TABLE_ROWS:
        return None
    origin, end = min(line.x0 for line in lines), max(line.x1 for line in lines)
    if end - origin > _FAR:
        return None
    crossing = _crossings(lines, origin, int(end - origin) + 1)
    low, high = int(0.25 * (end - origin)), int(0.75 * (end - origin))
    fewest = min(crossing[low : high + 1])
    if fewest > len(lines) * (1 - _GUTTER_KEPT):
        return None
    best: tuple[int, int] | None = None
    start: int | None = None
    for x in range(low, high + 1):
        if crossing[x] == fewest and x < high:
            start = x if start is None else start
        elif start is not None:
            if best is None or x - start > best[1] - best[0]:
                best = (start, x)
            start = None
    if best is None or best[1] - best[0] < _GUTTER_MIN_WIDTH:
        return None
    gutter = (origin + best[0], origin + best[1])
    return gutter if _both_sides_are_prose(lines, gutter, origin, end) else None


def _crossings(lines: Sequence[Line], origin: float, width: int) -> list[int]:
    """For each point from `origin`, how many lines cross it: a line crosses where its words,
    or the normal spaces between them, are (a wide gap is not crossed)."""
    change = [0] * (width + 2)
    for line in lines:
        for part in _segments(line):
            first = max(0, int(part.x0 - origin))
            last = min(width, int(part.x1 - origin) + 1)
            change[first] += 1
            change[last + 1] -= 1
    counts, running = [], 0
    for delta in change[: width + 1]:
        running += delta
        counts.append(running)
    return counts


def _both_sides_are_prose(
    lines: Sequence[Line], gutter: tuple[float, float], text_x0: float, text_x1: float
) -> bool:
    """Each side holds at least three lines, most of them one run of words (no wide gaps,
    which a table's columns have), many of them filling the column's width (a table's short
    cells do not)."""
    left_edge, right_edge = gutter
    sides: tuple[list[Line], list[Line]] = ([], [])
    for line in lines:
        parts = _split(line, left_edge, right_edge)
        if parts is not None:
            for side, found in zip(sides, parts, strict=True):
                side.extend(part for part in found if isinstance(part, Line))
    columns = ((sides[0], left_edge - text_x0), (sides[1], text_x1 - right_edge))
    for side, column_width in columns:
        if len(side) < _MIN_TABLE_ROWS or column_width <= 0:
            return False
        runs = sum(1 for line in side if len(_segments(line)) == 1)
        full = sum(1 for line in side if line.x1 - line.x0 >= _COLUMN_FILL * column_width)
        if runs < 0.8 * len(side) or full < _FULL_LINES * len(side):
            return False
    return True


# -- unruled tables --------------------------------------------------------------------------


def _wide_gap(line: Line) -> float:
    """A gap between words this wide separates table cells: a font size (prose spaces are a
    quarter to half of one)."""
    return max(line.height, 4.0)


def _segments(line: Line) -> list[Line]:
    """The line cut at its wide gaps."""
    parts: list[list[Word]] = [[line.words[0]]]
    gap = _wide_gap(line)
    for before, after in zip(line.words, line.words[1:], strict=False):
        if after.x0 - before.x1 >= gap:
            parts.append([after])
        else:
            parts[-1].append(after)
    return [Line(tuple(part)) for part in parts]


def _find_unruled(flow: Sequence[Item]) -> list[Item]:
    """The flow with each run of table-like lines replaced by a Table."""
    out: list[Item] = []
    index = 0
    while index < len(flow):
        end = _table_run(flow, index)
        run = [item for item in flow[index:end] if isinstance(item, Line)]
        rows = [[part.text for part in _segments(line)] for line in run]
        if end - index < _MIN_TABLE_ROWS:
            out.append(flow[index])
            index += 1
        elif not _short_cells(rows):  # aligned, but prose: all of it stays text
            out.extend(flow[index:end])
            index = end
        else:
            out.append(
                Table(
                    markdown_table(rows),
                    min(line.x0 for line in run),
                    max(line.x1 for line in run),
                    run[0].top,
                    run[-1].bottom,
                )
            )
            index = end
    return out


def _short_cells(rows: Sequence[Sequence[str]]) -> bool:
    """Table cells are short; lines of prose side by side (two columns the gutter test did
    not catch) are long."""
    cells = [cell for row in rows for cell in row]
    return sum(len(cell.split()) for cell in cells) <= _MAX_WORDS_PER_CELL * len(cells)


def _table_run(flow: Sequence[Item], start: int) -> int:
    """The end of the longest run from `start` of lines with the same aligned parts."""
    first = flow[start]
    if not isinstance(first, Line):
        return start
    columns = _segments(first)
    if len(columns) < 2 or _is_list_marker(columns[0].text):
        return start
    end = start + 1
    while end < len(flow):
        line = flow[end]
        if not isinstance(line, Line):
            break
        parts = _segments(line)
        if len(parts) != len(columns) or not all(map(_aligned, columns, parts)):
            break
        if _is_list_marker(parts[0].text):
            break
        end += 1
    return end


def _aligned(a: Line, b: Line) -> bool:
    return (
        abs(a.x0 - b.x0) <= _ALIGN_TOLERANCE
        or abs(a.x1 - b.x1) <= _ALIGN_TOLERANCE
        or abs((a.x0 + a.x1) - (b.x0 + b.x1)) / 2 <= _ALIGN_TOLERANCE
    )


def _is_list_marker(text: str) -> bool:
    """`1.`, `a)`, `•`: a list with tab stops is aligned like a table, but is a list."""
    stripped = text.rstrip(".)")
    return text in _LIST_MARKERS or (len(stripped) <= 3 and text != stripped and stripped.isalnum())


# -- text ------------------------------------------------------------------------------------


def _render(blocks: Sequence[Item]) -> str:
    """Lines joined by newlines, a blank line at paragraph gaps and around tables."""
    out: list[str] = []
    previous: Item | None = None
    for block in blocks:
        text = block.markdown if isinstance(block, Table) else block.text
        if not text:
            continue
        if previous is not None:
            out.append("\n\n" if _breaks(previous, block) else "\n")
        out.append(text)
        previous = block
    return "".join(out)


def _breaks(previous: Item, block: Item) -> bool:
    if isinstance(previous, Table) or isinstance(block, Table):
        return True
    gap = block.top - previous.bottom
    return gap > 0.6 * max(previous.height, block.height)
