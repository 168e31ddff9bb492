"""A PDF page's words in reading order, as pieces: lines of prose, tables and code blocks.

`words` gives each word's box and font, `rules` the lines the page draws. From them, in this
order: ruled tables are filled with their words, which leave the running text; the words are
grouped into lines (`blocks`); a two-column page is read column by column (`columns`), tables
across both columns found first; within each flow, tables between rules are found, then code
(a fixed-pitch listing is never read as a table, its line numbers included), then tables of
aligned lines (`tables`); lines are pieces of prose, starting a paragraph where the gap above
a line is wider than a line's spacing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ingest.loaders.pdf.blocks import (
    FAR,
    Code,
    Item,
    Line,
    Table,
    Word,
    group_lines,
    marked_margins,
)
from ingest.loaders.pdf.columns import gutter as find_gutter
from ingest.loaders.pdf.columns import reading_order, regrouped
from ingest.loaders.pdf.rules import Grid, Rule
from ingest.loaders.pdf.tables import filled, find_unruled, spanning_tables

_MIN_CODE_LINES = 2
_HEADING_WORDS = 12  # a heading is at most this many words
_HEADING_TEXT = re.compile(r"[^\W\d_]{2}")  # a heading has a word in it


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
    size: float = 0.0
    """A line's font size to a tenth of a point (0 for a table or code), by which `text`
    tells headings."""
    heading: bool = False
    """A line shaped as a heading may be (`_heading_shaped`): `text` decides by its size."""
    bold: bool = False
    apart: bool = False
    """A line that starts its paragraph or its flow."""


@dataclass(frozen=True)
class PageLayout:
    pieces: list[Piece] = field(default_factory=list)
    tables: int = 0
    code: int = 0


def lay_out(
    words: Sequence[Word], grids: Sequence[Grid] = (), rules: Sequence[Rule] = ()
) -> PageLayout:
    """The page's pieces in reading order from its words (`words`), its ruled tables'
    grids and its horizontal rules (`rules`)."""
    kept = [word for word in words if all(-FAR < v < FAR for v in _box(word))]
    tables = [table for grid in grids if (table := filled(grid, kept)) is not None]
    kept = [word for word in kept if not any(table.holds(word) for table in tables)]
    lines = marked_margins(group_lines(kept))
    gutter = find_gutter(lines)
    level = [rule for rule in rules if rule.horizontal]
    if gutter is not None:
        wide, lines = spanning_tables(lines, level, gutter)
        tables += wide
        lines = regrouped(lines, gutter)
    flows = reading_order([*tables, *lines], gutter)
    pieces: list[Piece] = []
    found, code = len(tables), 0
    for flow in flows:
        # Rules bound a table before its fixed-pitch cells could be taken for code; code is
        # found before aligned lines could be taken for a table (a listing's line numbers).
        blocks = find_unruled(_find_code(find_unruled(flow, level)), None)
        found += sum(isinstance(block, Table) for block in blocks)
        code += sum(isinstance(block, Code) for block in blocks)
        pieces.extend(_pieces(blocks, first=not pieces))
    return PageLayout(pieces, found, code)


def _box(word: Word) -> tuple[float, float, float, float]:
    return word.x0, word.x1, word.top, word.bottom


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


def _pieces(blocks: Sequence[Item], *, first: bool) -> list[Piece]:
    """The flow's blocks as pieces; the flow itself starts a paragraph (unless first)."""
    out: list[Piece] = []
    previous: Item | None = None
    for block in blocks:
        paragraph = (not first) if previous is None else _breaks(previous, block)
        if isinstance(block, Line):
            piece = Piece(
                block.text,
                "line",
                paragraph,
                block.margin,
                block.size,
                _heading_shaped(block),
                block.bold,
                paragraph or previous is None,
            )
        else:
            kind: PieceKind = "table" if isinstance(block, Table) else "code"
            piece = Piece(block.markdown, kind, paragraph)
        if piece.text:
            out.append(piece)
            previous = block
    return out


def _heading_shaped(line: Line) -> bool:
    """A short line of words, in a proportional font, not ending as a sentence or a clause
    does: a heading, if its size or weight says so (`text`)."""
    text = line.text
    return (
        not line.mono
        and _HEADING_TEXT.search(text) is not None
        and len(text.split()) <= _HEADING_WORDS
        and text.rstrip()[-1:] not in ".,;:"
    )


def _breaks(previous: Item, block: Item) -> bool:
    if not isinstance(previous, Line) or not isinstance(block, Line):
        return True
    gap = block.top - previous.bottom
    return gap > 0.6 * max(previous.height, block.height)
