"""A PDF page's words in reading order, as pieces: lines of prose, tables and code blocks.

`pdf_words` gives each word's box and font, `pdf_rules` the lines the page draws. From them:

- ruled tables (cells drawn with lines) are filled with their words, which leave the running
  text; the table is written at its place;
- the words are grouped into lines; a page with a vertical gutter that most of its prose lines
  do not cross, each side of it filled by one run of prose per line, is read as two columns:
  left column, then right, between any lines or tables that span the gutter (a title, a
  figure or table across both columns);
- within each column (so before any table is looked for), runs of lines set in a fixed-pitch
  font are code, kept as a fenced block with their indentation and spacing (a listing's line
  numbers included), never read as a table;
- unruled tables are found conservatively in what is left: at least three consecutive lines
  split by wide gaps into cells whose columns line up; the lines between two horizontal rules
  that bound them (booktabs' top and bottom rules) are one table, a header with fewer cells
  included. pdfplumber's own text strategy finds "tables" in ordinary paragraphs, so it is
  not used;
- lines are pieces of prose, starting a paragraph where the gap above a line is wider than a
  line's spacing. The page's top-most and bottom-most lines carry a key (their text, digits
  masked) by which `pdf_text` recognises running headers and footers across pages.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ingest.loaders.pdf_rules import Grid, Rule
from ingest.loaders.tables import markdown_table

_ALIGN_TOLERANCE = 2.5  # points: how far the edges of one column's parts may wander
_MIN_TABLE_ROWS = 3
_GUTTER_MIN_WIDTH = 8.0  # points
_GUTTER_KEPT = 0.5  # the share of a page's lines that must not cross a gutter
_COLUMN_WIDTH = 0.55  # of the text's width: a line at most this wide may be a column's
_COLUMN_LINE = 0.3  # ... and at least this wide
_SPLIT_GAP = 6.0  # points: words either side of a gutter are further apart than this
_STRAY_CROSSINGS = 0.1  # of the column lines: a gutter may be crossed by this few (the lines
# of a title block, an author's address, an equation's number)
_COLUMN_FILL = 0.7  # a full line of a column fills this much of its width, at least ...
_FULL_LINES = 0.25  # ... and this share of a column's lines are full (not paragraph ends, code)
_FAR = 20_000.0  # points (7 m): coordinates beyond are no page's, and would cost memory
_MAX_WORDS_PER_CELL = 5  # on average, in an unruled table
_LIST_MARKERS = frozenset("\u2022\u2023\u25e6\u25aa\u2013\u2014-*\u00b7")  # bullets, dashes
_WRAPPED = 0.2  # of a column's width: a cell's text ending this near its right edge was wrapped
_PROSE_WIDTH = 0.6  # of a table's rule: a single run of words this wide is prose, not a row
_CODE_SHARE = 0.6  # of a line's characters in a fixed-pitch font: a line of code
_MIN_CODE_LINES = 2
_DIGITS = re.compile(r"\d+")
_TALL = 1.3  # times the page's median word height: a taller box is a math font's or a title's


@dataclass(frozen=True, slots=True)
class Word:
    text: str
    x0: float
    x1: float
    top: float
    bottom: float
    mono: bool = False
    baseline: float | None = None
    """Top-down, as the box; None where the reader does not tell (a fifth of the box above
    its bottom is taken)."""

    @property
    def base(self) -> float:
        return (
            self.bottom - 0.2 * (self.bottom - self.top) if self.baseline is None else self.baseline
        )


@dataclass(frozen=True)
class Line:
    words: tuple[Word, ...]
    margin: str | None = None
    """The page's top-most and bottom-most lines: the key of a running header or footer."""
    spans: bool = False
    """Read across the page whatever its gaps: a header or footer set apart from the text."""

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

    @property
    def mono(self) -> bool:
        """Most of its characters are in a fixed-pitch font: a line of code."""
        total = sum(len(word.text) for word in self.words)
        mono = sum(len(word.text) for word in self.words if word.mono)
        return mono >= _CODE_SHARE * total


@dataclass(frozen=True)
class Table:
    markdown: str
    x0: float
    x1: float
    top: float
    bottom: float

    @property
    def height(self) -> float:
        return self.bottom - self.top

    def holds(self, word: Word) -> bool:
        """Whether the middle of `word` is inside the table (its words are its cells)."""
        middle_x, middle_y = (word.x0 + word.x1) / 2, (word.top + word.bottom) / 2
        return self.x0 <= middle_x <= self.x1 and self.top <= middle_y <= self.bottom


@dataclass(frozen=True)
class Code:
    lines: tuple[Line, ...]

    @property
    def x0(self) -> float:
        return min(line.x0 for line in self.lines)

    @property
    def x1(self) -> float:
        return max(line.x1 for line in self.lines)

    @property
    def top(self) -> float:
        return self.lines[0].top

    @property
    def bottom(self) -> float:
        return self.lines[-1].bottom

    @property
    def height(self) -> float:
        return self.lines[0].height

    @property
    def markdown(self) -> str:
        return "```\n" + "\n".join(_code_lines(self.lines)) + "\n```"


Item = Line | Table | Code
PieceKind = Literal["line", "table", "code"]


@dataclass(frozen=True, slots=True)
class Piece:
    """A part of the page's text in reading order: a line of prose, a table or a code block
    (Markdown), whether a blank line goes before it, and for the page's top-most and
    bottom-most lines the key that tells a running header or footer (`margin_key`)."""

    text: str
    kind: PieceKind = "line"
    paragraph: bool = False
    margin: str | None = None


@dataclass(frozen=True)
class PageLayout:
    pieces: list[Piece] = field(default_factory=list)
    tables: int = 0
    code: int = 0


def margin_key(text: str) -> str:
    """A line as running headers and footers repeat it: digits masked (page numbers), case
    and spacing ignored."""
    return " ".join(_DIGITS.sub("#", text).split()).casefold()


def lay_out(
    words: Sequence[Word], grids: Sequence[Grid] = (), rules: Sequence[Rule] = ()
) -> PageLayout:
    """The page's pieces in reading order from its words (`pdf_words`), its ruled tables'
    grids and its horizontal rules (`pdf_rules`)."""
    kept = [word for word in words if all(-_FAR < v < _FAR for v in _box(word))]
    tables = [table for grid in grids if (table := _filled(grid, kept)) is not None]
    kept = [word for word in kept if not any(table.holds(word) for table in tables)]
    lines = _marked_margins(_group_lines(kept))
    gutter = _gutter(lines)
    level = [rule for rule in rules if rule.horizontal]
    if gutter is not None:
        wide, lines = _spanning_tables(lines, level, gutter)
        tables += wide
        lines = _regrouped(lines, gutter)
    flows = _reading_order([*tables, *lines], gutter)
    pieces: list[Piece] = []
    found, code = len(tables), 0
    for flow in flows:
        # Rules bound a table before its fixed-pitch cells could be taken for code; code is
        # found before aligned lines could be taken for a table (a listing's line numbers).
        blocks = _find_unruled(_find_code(_find_unruled(flow, level)), None)
        found += sum(isinstance(block, Table) for block in blocks)
        code += sum(isinstance(block, Code) for block in blocks)
        pieces.extend(_pieces(blocks, first=not pieces))
    return PageLayout(pieces, found, code)


def _box(word: Word) -> tuple[float, float, float, float]:
    return word.x0, word.x1, word.top, word.bottom


def _filled(grid: Grid, words: Sequence[Word]) -> Table | None:
    """A ruled table's Markdown, its cells filled with the words whose middles lie in them;
    None for a grid that holds no table (fewer than two rows of two cells with words: a box,
    a chart's grid)."""
    inside = [w for w in words if grid.x0 <= (w.x0 + w.x1) / 2 <= grid.x1]
    inside = [w for w in inside if grid.top <= (w.top + w.bottom) / 2 <= grid.bottom]
    rows = [[_cell_text(cell, inside) for cell in row] for row in grid.rows]
    if sum(1 for row in rows if sum(1 for cell in row if cell) >= 2) < 2:
        return None
    markdown = markdown_table(rows)
    return Table(markdown, grid.x0, grid.x1, grid.top, grid.bottom) if markdown else None


def _cell_text(cell: tuple[float, float, float, float] | None, words: Sequence[Word]) -> str:
    if cell is None:
        return ""
    x0, top, x1, bottom = cell
    found = [
        w for w in words if x0 <= (w.x0 + w.x1) / 2 < x1 and top <= (w.top + w.bottom) / 2 < bottom
    ]
    return " ".join(line.text for line in _group_lines(found))


def _group_lines(words: Iterable[Word]) -> list[Line]:
    """Words share a line when their baselines are within half a line's height of its anchor:
    the tallest word of ordinary size met so far (top down), so that a superscript met first
    hands the line to the text it belongs to, and its subscripts stay on it. A math font's
    giant box (a sum sign, a bracket) neither anchors a line nor widens its reach: heights
    count up to `_TALL` times the page's median. The anchor is one word, not a running
    extent: that would grow with every word and chain lines into one."""
    ordered = sorted(words, key=lambda w: (w.base, w.x0))
    if not ordered:
        return []
    cap = _TALL * statistics.median(w.bottom - w.top for w in ordered)
    lines: list[list[Word]] = []
    base = height = 0.0  # the anchor's
    for word in ordered:
        size = min(word.bottom - word.top, cap)
        if lines and abs(word.base - base) < 0.5 * max(height, size):
            lines[-1].append(word)
            if size > height:
                base, height = word.base, size
        else:
            lines.append([word])
            base, height = word.base, size
    return [Line(tuple(sorted(line, key=lambda w: w.x0))) for line in lines]


def _marked_margins(lines: list[Line]) -> list[Line]:
    """The lines (top down), the first and the last marked with their margin keys, and as
    spanning the page where set apart from the text by more than a line's height."""
    if not lines:
        return lines
    marked = list(lines)
    for index in {0, len(lines) - 1}:
        line = lines[index]
        others = [other for other in lines if other is not line]
        gap = min((_gap(line, other) for other in others), default=0.0)
        marked[index] = Line(line.words, margin_key(line.text), gap > 1.5 * line.height)
    return marked


def _gap(a: Line, b: Line) -> float:
    return max(b.top - a.bottom, a.top - b.bottom)


def _spanning_tables(
    lines: list[Line], rules: Sequence[Rule], gutter: tuple[float, float]
) -> tuple[list[Table], list[Line]]:
    """Tables between rules drawn across the gutter (a table across both columns), found
    before the lines are split into columns (which would split its rows); and the lines
    left."""
    middle = (gutter[0] + gutter[1]) / 2
    across = [rule for rule in rules if rule.x0 < middle < rule.x1]
    if not across:
        return [], lines
    found = _find_unruled(lines, across)
    tables = [item for item in found if isinstance(item, Table)]
    return tables, [item for item in found if isinstance(item, Line)]


def _regrouped(lines: Sequence[Line], gutter: tuple[float, float]) -> list[Line]:
    """The lines grouped again within each column (and among those that span the gutter): a
    line of one column is not merged with a line of the other set a little higher or lower
    (their subscripts and superscripts would be left on lines of their own). Margin marks are
    kept on the lines made of a marked line's words."""
    marks: dict[int, Line] = {id(w): line for line in lines if line.margin for w in line.words}
    groups: tuple[list[Word], list[Word], list[Word]] = ([], [], [])
    for line in lines:
        parts = _split(line, *gutter)
        if parts is None:
            groups[0].extend(line.words)
        else:
            for group, found in zip(groups[1:], parts, strict=True):
                group.extend(word for part in found for word in part.words)  # type: ignore[union-attr]
    regrouped: list[Line] = []
    for index, group in enumerate(groups):
        for line in _group_lines(group):
            mark = marks.get(id(line.words[0]))
            if mark is not None and all(marks.get(id(w)) is mark for w in line.words):
                line = Line(line.words, mark.margin, mark.spans and index == 0)
            regrouped.append(line)
    return regrouped


# -- columns ---------------------------------------------------------------------------------


def _reading_order(items: list[Item], gutter: tuple[float, float] | None) -> list[list[Item]]:
    """The items as flows, each read top down: one flow for a single-column page; for two
    columns, per stretch between items spanning the gutter, the left flow then the right."""
    by_top = sorted(items, key=lambda item: (item.top, item.x0))
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
    """The item's parts left and right of the gutter's middle; None if it spans the gutter
    (a word or block across the middle, or words on both sides closer than a gutter). A line
    of a column that runs a little into the gutter (an overfull line, a long URL) stays in
    its column."""
    middle = (left_edge + right_edge) / 2
    if not isinstance(item, Line):
        if item.x1 <= middle:
            return [item], []
        if item.x0 >= middle:
            return [], [item]
        return None
    if item.spans or any(word.x0 < middle < word.x1 for word in item.words):
        return None
    left = tuple(word for word in item.words if word.x1 <= middle)
    right = tuple(word for word in item.words if word.x0 >= middle)
    if left and right and right[0].x0 - left[-1].x1 < max(_SPLIT_GAP, item.height):
        return None
    return ([Line(left, item.margin)] if left else []), (
        [Line(right, item.margin)] if right else []
    )


def _gutter(lines: Sequence[Line]) -> tuple[float, float] | None:
    """The widest vertical band in the middle of the text that the page's column-wide runs of
    words (lines cut at wide gaps, each `_COLUMN_LINE` to `_COLUMN_WIDTH` of the text's width:
    short runs are names, labels and table cells, set anywhere) do not
    cross, if most of the page's lines do not cross it and both its sides read as columns of
    text; None for a single-column page. Wider runs (a title, a figure or table across both
    columns) are left out of the search, so a float at the top of the page does not hide the
    gutter; two columns' lines set on the same baselines are two runs each."""
    if len(lines) < 2 * _MIN_TABLE_ROWS:
        return None
    origin, end = min(line.x0 for line in lines), max(line.x1 for line in lines)
    width = end - origin
    if width > _FAR or width <= 0:
        return None
    narrow = [
        run
        for line in lines
        for run in _segments(line)
        if _COLUMN_LINE * width <= run.x1 - run.x0 <= _COLUMN_WIDTH * width
    ]
    if len(narrow) < 2 * _MIN_TABLE_ROWS:
        return None
    crossing = _crossings(narrow, origin, int(width) + 1)
    low, high = int(0.25 * width), int(0.75 * width)
    allowed = max(2, int(_STRAY_CROSSINGS * len(narrow)))
    if min(crossing[low : high + 1]) > allowed:
        return None
    best: tuple[int, int] | None = None
    start: int | None = None
    for x in range(low, high + 1):
        if crossing[x] <= allowed and x < high:
            start = x if start is None else start
        elif start is not None:
            if best is None or x - start > best[1] - best[0]:
                best = (start, x)
            start = None
    if best is None or best[1] - best[0] < _GUTTER_MIN_WIDTH:
        return None
    gutter = _narrowed(lines, origin + best[0], origin + best[1])
    spanning = sum(1 for line in lines if _split(line, *gutter) is None)
    if spanning > (1 - _GUTTER_KEPT) * len(lines):
        return None
    return gutter if _both_sides_are_columns(lines, gutter, origin, end) else None


def _narrowed(lines: Sequence[Line], left: float, right: float) -> tuple[float, float]:
    """The part of the band `left`..`right` that the fewest words reaching into it cover: a
    column's lines that end in the band (a table of contents' page numbers, a long word)
    push the gutter right of them. Lines that run across the band with no gap wider than
    `_SPLIT_GAP` in it (a title, a caption across both columns) count nowhere."""
    count = int(right - left) + 1
    covered = [0] * count
    for line in lines:
        if not _gap_in(line, left, right):
            continue
        for word in line.words:
            first, last = max(0, int(word.x0 - left)), min(count - 1, int(word.x1 - left))
            for x in range(first, last + 1):
                covered[x] += 1
    fewest = min(covered)
    best = (0, 0)
    start: int | None = None
    for x in range(count + 1):
        if x < count and covered[x] == fewest:
            start = x if start is None else start
        elif start is not None:
            best = max(best, (start, x), key=lambda band: band[1] - band[0])
            start = None
    return left + best[0], left + best[1]


def _gap_in(line: Line, left: float, right: float) -> bool:
    """Whether the line leaves a gap of `_SPLIT_GAP` or more somewhere in `left`..`right`."""
    spans = sorted((w.x0, w.x1) for w in line.words if w.x1 > left and w.x0 < right)
    reached = left
    for x0, x1 in spans:
        if x0 - reached >= _SPLIT_GAP:
            return True
        reached = max(reached, x1)
    return right - reached >= _SPLIT_GAP


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


def _both_sides_are_columns(
    lines: Sequence[Line], gutter: tuple[float, float], text_x0: float, text_x1: float
) -> bool:
    """Each side holds at least three lines, and a good share of them fill the column's width
    (a table's short cells do not; a table of contents' entries, their page numbers set at
    the column's edge, do)."""
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
        full = sum(1 for line in side if line.x1 - line.x0 >= _COLUMN_FILL * column_width)
        if full < _FULL_LINES * len(side):
            return False
    return True


# -- code ------------------------------------------------------------------------------------


def _find_code(flow: Sequence[Item]) -> list[Item]:
    """The flow with each run of `_MIN_CODE_LINES` or more fixed-pitch lines made a Code."""
    out: list[Item] = []
    run: list[Line] = []
    for item in [*flow, None]:
        if isinstance(item, Line) and item.mono:
            run.append(item)
            continue
        if len(run) >= _MIN_CODE_LINES:
            out.append(Code(tuple(run)))
        else:
            out.extend(run)
        run = []
        if item is not None:
            out.append(item)
    return out


def _code_lines(lines: Sequence[Line]) -> list[str]:
    """The lines with their indentation and inner spacing in characters of the code's font."""
    widths = [
        (word.x1 - word.x0) / len(word.text)
        for line in lines
        for word in line.words
        if word.mono and word.text
    ]
    width = statistics.median(widths) if widths else 5.0
    origin = min(line.x0 for line in lines)
    out: list[str] = []
    for line in lines:
        parts = [" " * round((line.x0 - origin) / width)]
        previous: Word | None = None
        for word in line.words:
            if previous is not None:
                parts.append(" " * max(1, round((word.x0 - previous.x1) / width)))
            parts.append(word.text.replace("```", "` ` `"))
            previous = word
        out.append("".join(parts).rstrip())
    return out


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


def _find_unruled(flow: Sequence[Item], rules: Sequence[Rule] | None) -> list[Item]:
    """The flow with each run of table-like lines replaced by a Table: with `rules`, lines
    between two horizontal rules that bound them (`_ruled_run`); without, aligned lines
    (`_table_run`)."""
    out: list[Item] = []
    index = 0
    while index < len(flow):
        bounded = rules is not None
        end = _ruled_run(flow, index, rules) if rules is not None else _table_run(flow, index)
        run = [item for item in flow[index:end] if isinstance(item, Line)]
        table = _table(run, bounded) if end - index >= _MIN_TABLE_ROWS else None
        if table is None and end - index >= _MIN_TABLE_ROWS and not bounded:
            out.extend(flow[index:end])  # aligned, but prose: all of it stays text
            index = end
        elif table is None:
            out.append(flow[index])
            index += 1
        else:
            out.append(table)
            index = end
    return out


def _table(run: Sequence[Line], bounded: bool) -> Table | None:
    rows = _rows(run) if bounded else [[part.text for part in _segments(line)] for line in run]
    if rows is None or not _short_cells(rows):
        return None
    markdown = markdown_table(rows)
    if not markdown:
        return None
    return Table(
        markdown,
        min(line.x0 for line in run),
        max(line.x1 for line in run),
        run[0].top,
        run[-1].bottom,
    )


def _ruled_run(flow: Sequence[Item], start: int, rules: Sequence[Rule]) -> int:
    """The end of the lines from `start` that lie between a horizontal rule just above the
    first and a rule of about the same extent below them (booktabs: \\toprule, \\midrule,
    \\bottomrule), if at least three, two of them split by wide gaps; `start` if none."""
    first = flow[start]
    above = _rule_above(first, rules) if isinstance(first, Line) else None
    if above is None:
        return start
    bottom = _last_rule(flow[start:], rules, above)
    if bottom is None:
        return start
    end = start
    while end < len(flow):
        line = flow[end]
        if not isinstance(line, Line) or line.bottom > bottom + 1.0:
            break
        if line.x0 < above.x0 - _ALIGN_TOLERANCE or line.x1 > above.x1 + _ALIGN_TOLERANCE:
            break
        end += 1
    lines = [item for item in flow[start:end] if isinstance(item, Line)]
    if len(lines) < _MIN_TABLE_ROWS or sum(len(_segments(line)) >= 2 for line in lines) < 2:
        return start
    return end


def _last_rule(flow: Sequence[Item], rules: Sequence[Rule], above: Rule) -> float | None:
    """Where the table that starts below `above` ends: the last of the rules of the same
    extent below it (\\midrule, \\bottomrule) up to which every stretch between two rules
    reads as table rows (`_rows_between`); None when not even the first does."""
    lines = [item for item in flow if isinstance(item, Line)]
    below = sorted(
        rule.top
        for rule in rules
        if rule.top > above.top + 1.0
        and abs(rule.x0 - above.x0) <= _ALIGN_TOLERANCE
        and abs(rule.x1 - above.x1) <= _ALIGN_TOLERANCE
    )
    bottom: float | None = None
    previous = above.top
    for top in below:
        stretch = [line for line in lines if previous < line.top and line.bottom <= top + 1.0]
        if not _rows_between(stretch, above):
            break
        bottom, previous = top, top
    return bottom


def _rows_between(lines: Sequence[Line], rule: Rule) -> bool:
    """Lines between two rules of a table: some split into cells, none a line of prose (one
    run of words across most of the rule's width)."""
    width = rule.x1 - rule.x0
    if not any(len(_segments(line)) >= 2 for line in lines):
        return False
    return not any(
        len(_segments(line)) == 1 and line.x1 - line.x0 > _PROSE_WIDTH * width for line in lines
    )


def _rule_above(line: Line, rules: Sequence[Rule]) -> Rule | None:
    """A horizontal rule just above the line (within two line heights) that spans it."""
    near = [
        rule
        for rule in rules
        if 0 <= line.top - rule.top <= 2 * line.height
        and rule.x0 - _ALIGN_TOLERANCE <= line.x0
        and line.x1 <= rule.x1 + _ALIGN_TOLERANCE
    ]
    return max(near, key=lambda rule: rule.top, default=None)


def _rows(lines: Sequence[Line]) -> list[list[str]] | None:
    """The lines' cells by the table's columns: the x ranges its cells cover, merged where
    they overlap (a header's cell spanning two columns takes the first); None for one column.
    A line with words in one column only, under a cell of that column that ran to the
    column's right edge, is that cell's text wrapped (a paragraph cell), not a row."""
    spans = sorted((part.x0, part.x1) for line in lines for part in _segments(line))
    columns: list[list[float]] = []
    for x0, x1 in spans:
        if columns and x0 <= columns[-1][1] + 1.0:
            columns[-1][1] = max(columns[-1][1], x1)
        else:
            columns.append([x0, x1])
    if len(columns) < 2:
        return None
    rows: list[list[str]] = []
    ends: list[list[float]] = []  # where each cell's text ends, of the last line read into it
    for line in lines:
        cells, reach = [""] * len(columns), [0.0] * len(columns)
        for part in _segments(line):
            index = next(i for i, (x0, x1) in enumerate(columns) if x0 <= part.x0 <= x1)
            cells[index] = f"{cells[index]} {part.text}".strip()
            reach[index] = part.x1
        filled = [i for i, cell in enumerate(cells) if cell]
        if rows and len(filled) == 1 and _wraps(rows[-1], ends[-1], columns, filled[0]):
            rows[-1][filled[0]] = _continued(rows[-1][filled[0]], cells[filled[0]])
            ends[-1][filled[0]] = reach[filled[0]]
            continue
        rows.append(cells)
        ends.append(reach)
    return rows


def _continued(cell: str, more: str) -> str:
    """A cell's text and its next line: a word broken by a hyphen joined."""
    if cell.endswith("-") and cell[-2:-1].isalpha() and more[:1].islower():
        return cell[:-1] + more
    return f"{cell} {more}"


def _wraps(row: list[str], ends: list[float], columns: list[list[float]], index: int) -> bool:
    """Whether the row's cell at `index` ran to its column's right edge (and so a line below
    with words in that column only goes on with it)."""
    x0, x1 = columns[index]
    return index > 0 and bool(row[index]) and ends[index] >= x1 - _WRAPPED * (x1 - x0)


def _short_cells(rows: Sequence[Sequence[str]]) -> bool:
    """Table cells are short; lines of prose side by side (two columns the gutter test did
    not catch) are long."""
    cells = [cell for row in rows for cell in row if cell]
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


# -- pieces ----------------------------------------------------------------------------------


def _pieces(blocks: Sequence[Item], *, first: bool) -> list[Piece]:
    """The flow's blocks as pieces; the flow itself starts a paragraph (unless first)."""
    out: list[Piece] = []
    previous: Item | None = None
    for block in blocks:
        kind: PieceKind = "line"
        margin: str | None = None
        if isinstance(block, Line):
            text, margin = block.text, block.margin
        else:
            text, kind = block.markdown, "table" if isinstance(block, Table) else "code"
        if not text:
            continue
        paragraph = (not first) if previous is None else _breaks(previous, block)
        out.append(Piece(text, kind, paragraph, margin))
        previous = block
    return out


def _breaks(previous: Item, block: Item) -> bool:
    if not isinstance(previous, Line) or not isinstance(block, Line):
        return True
    gap = block.top - previous.bottom
    return gap > 0.6 * max(previous.height, block.height)
