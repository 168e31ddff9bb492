"""Columns: a page whose text is set in two columns is read left column, then right.

A page with a vertical gutter that its column-wide runs of words do not cross, both its sides
read as columns, is read as two: left column, then right, between any lines or blocks that span
the gutter (a title, a figure or table across both columns). Lines are grouped again within
each column once the gutter is known, so two columns' lines set a little apart in height do
not share a line.
"""

from __future__ import annotations

from collections.abc import Sequence

from ingest.loaders.pdf.blocks import FAR, Item, Line, Word, group_lines, segments

_MIN_COLUMN_LINES = 3
_GUTTER_MIN_WIDTH = 8.0  # points
_GUTTER_KEPT = 0.5  # the share of a page's lines that must not cross a gutter
_COLUMN_WIDTH = 0.55  # of the text's width: a line at most this wide may be a column's
_COLUMN_LINE = 0.3  # ... and at least this wide
_SPLIT_GAP = 6.0  # points: words either side of a gutter are further apart than this
_STRAY_CROSSINGS = 0.1  # of the column lines: a gutter may be crossed by this few (the lines
# of a title block, an author's address, an equation's number)
_COLUMN_FILL = 0.7  # a full line of a column fills this much of its width, at least ...
_FULL_LINES = 0.25  # ... and this share of a column's lines are full (not paragraph ends, code)


def reading_order(items: list[Item], gutter: tuple[float, float] | None) -> list[list[Item]]:
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
        parts = split(item, *gutter)
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


def split(item: Item, left_edge: float, right_edge: float) -> tuple[list[Item], list[Item]] | None:
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


def regrouped(lines: Sequence[Line], gutter: tuple[float, float]) -> list[Line]:
    """The lines grouped again within each column (and among those that span the gutter): a
    line of one column is not merged with a line of the other set a little higher or lower
    (their subscripts and superscripts would be left on lines of their own). Margin marks are
    kept on the lines made of a marked line's words."""
    marks: dict[int, Line] = {id(w): line for line in lines if line.margin for w in line.words}
    groups: tuple[list[Word], list[Word], list[Word]] = ([], [], [])
    for line in lines:
        parts = split(line, *gutter)
        if parts is None:
            groups[0].extend(line.words)
        else:
            for group, found in zip(groups[1:], parts, strict=True):
                group.extend(word for part in found for word in part.words)  # type: ignore[union-attr]
    regrouped: list[Line] = []
    for index, group in enumerate(groups):
        for line in group_lines(group):
            mark = marks.get(id(line.words[0]))
            if mark is not None and all(marks.get(id(w)) is mark for w in line.words):
                line = Line(line.words, mark.margin, mark.spans and index == 0)
            regrouped.append(line)
    return regrouped


def gutter(lines: Sequence[Line]) -> tuple[float, float] | None:
    """The widest vertical band in the middle of the text that the page's column-wide runs of
    words (lines cut at wide gaps, each `_COLUMN_LINE` to `_COLUMN_WIDTH` of the text's width:
    short runs are names, labels and table cells, set anywhere) do not
    cross, if most of the page's lines do not cross it and both its sides read as columns of
    text; None for a single-column page. Wider runs (a title, a figure or table across both
    columns) are left out of the search, so a float at the top of the page does not hide the
    gutter; two columns' lines set on the same baselines are two runs each."""
    if len(lines) < 2 * _MIN_COLUMN_LINES:
        return None
    origin, end = min(line.x0 for line in lines), max(line.x1 for line in lines)
    width = end - origin
    if width > FAR or width <= 0:
        return None
    narrow = [
        run
        for line in lines
        for run in segments(line)
        if _COLUMN_LINE * width <= run.x1 - run.x0 <= _COLUMN_WIDTH * width
    ]
    if len(narrow) < 2 * _MIN_COLUMN_LINES:
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
    spanning = sum(1 for line in lines if split(line, *gutter) is None)
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
        for part in segments(line):
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
        parts = split(line, left_edge, right_edge)
        if parts is not None:
            for side, found in zip(sides, parts, strict=True):
                side.extend(part for part in found if isinstance(part, Line))
    columns = ((sides[0], left_edge - text_x0), (sides[1], text_x1 - right_edge))
    for side, column_width in columns:
        if len(side) < _MIN_COLUMN_LINES or column_width <= 0:
            return False
        full = sum(1 for line in side if line.x1 - line.x0 >= _COLUMN_FILL * column_width)
        if full < _FULL_LINES * len(side):
            return False
    return True
