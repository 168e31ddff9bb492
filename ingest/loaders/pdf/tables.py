"""Tables on a PDF page: ruled ones (cells drawn with lines), and those without.

- ruled tables: the grids `rules` finds, filled with the words whose middles lie in each cell;
- tables between horizontal rules that bound them (booktabs' top, middle and bottom rules):
  the lines from just below a rule to the last rule of the same extent up to which every
  stretch between rules reads as rows; a header with fewer cells included, a paragraph cell
  wrapped over lines kept one cell;
- aligned lines: at least three consecutive lines split by wide gaps into the same number of
  cells whose columns line up. pdfplumber's own text strategy finds "tables" in ordinary
  paragraphs, so it is not used.
"""

from __future__ import annotations

from collections.abc import Sequence

from ingest.loaders.pdf.blocks import Item, Line, Table, Word, group_lines, segments
from ingest.loaders.pdf.rules import Grid, Rule
from ingest.loaders.tables import markdown_table

_MIN_ROWS = 3
_ALIGN_TOLERANCE = 2.5  # points: how far the edges of one column's parts may wander
_MAX_WORDS_PER_CELL = 5  # on average, in an unruled table
_LIST_MARKERS = frozenset("\u2022\u2023\u25e6\u25aa\u2013\u2014-*\u00b7")  # bullets, dashes
_WRAPPED = 0.2  # of a column's width: a cell's text ending this near its right edge was wrapped
_PROSE_WIDTH = 0.6  # of a table's rule: a single run of words this wide is prose, not a row


def filled(grid: Grid, words: Sequence[Word]) -> Table | None:
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
    return " ".join(line.text for line in group_lines(found))


def spanning_tables(
    lines: list[Line], rules: Sequence[Rule], gutter: tuple[float, float]
) -> tuple[list[Table], list[Line]]:
    """Tables between rules drawn across the gutter (a table across both columns), found
    before the lines are split into columns (which would split its rows); and the lines
    left."""
    middle = (gutter[0] + gutter[1]) / 2
    across = [rule for rule in rules if rule.x0 < middle < rule.x1]
    if not across:
        return [], lines
    found = find_unruled(lines, across)
    tables = [item for item in found if isinstance(item, Table)]
    return tables, [item for item in found if isinstance(item, Line)]


def find_unruled(flow: Sequence[Item], rules: Sequence[Rule] | None) -> list[Item]:
    """The flow with each run of table-like lines replaced by a Table: with `rules`, lines
    between two horizontal rules that bound them (`_ruled_run`); without, aligned lines
    (`_table_run`)."""
    out: list[Item] = []
    index = 0
    while index < len(flow):
        bounded = rules is not None
        end = _ruled_run(flow, index, rules) if rules is not None else _table_run(flow, index)
        run = [item for item in flow[index:end] if isinstance(item, Line)]
        table = _table(run, bounded) if end - index >= _MIN_ROWS else None
        if table is None and end - index >= _MIN_ROWS and not bounded:
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
    rows = _rows(run) if bounded else [[part.text for part in segments(line)] for line in run]
    if rows is None or not _short_cells(rows) or _leaders(rows):
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


def _leaders(rows: Sequence[Sequence[str]]) -> bool:
    """Rows with a cell of dot leaders are a contents' or an index's entries, not a table."""
    return any(cell.strip() and not cell.replace(".", "").strip() for row in rows for cell in row)


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
    if len(lines) < _MIN_ROWS or sum(len(segments(line)) >= 2 for line in lines) < 2:
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
    if not any(len(segments(line)) >= 2 for line in lines):
        return False
    return not any(
        len(segments(line)) == 1 and line.x1 - line.x0 > _PROSE_WIDTH * width for line in lines
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
    spans = sorted((part.x0, part.x1) for line in lines for part in segments(line))
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
        for part in segments(line):
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
    columns = segments(first)
    if len(columns) < 2 or _is_list_marker(columns[0].text):
        return start
    end = start + 1
    while end < len(flow):
        line = flow[end]
        if not isinstance(line, Line):
            break
        parts = segments(line)
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
