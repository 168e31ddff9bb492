"""The blocks a PDF page is read into: words (`words` gives them), lines, tables and code.

Lines group words by baseline around an anchor word (`group_lines`); a line is code when most
of its characters are in a fixed-pitch font (`Line.mono`), and a run of such lines is a Code
block, written as a fenced block with its indentation and inner spacing. The page's top-most
and bottom-most lines carry a key (`margin_key`: their text, digits masked) by which `text`
recognises running headers and footers across pages.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

FAR = 20_000.0  # points (7 m): coordinates beyond are no page's, and would cost memory
_CODE_SHARE = 0.6  # of a line's characters in a fixed-pitch font: a line of code
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
    size: float = 0.0
    """Its font's size in points (0: not told)."""
    bold: bool = False

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
    def size(self) -> float:
        """The font size most of its characters are set in (to a tenth of a point)."""
        return commonest_size((word.size, len(word.text)) for word in self.words)

    @property
    def bold(self) -> bool:
        return all(word.bold for word in self.words)

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
    def markdown(self) -> str:
        return "```\n" + "\n".join(code_lines(self.lines)) + "\n```"


Item = Line | Table | Code


def commonest_size(sizes: Iterable[tuple[float, int]]) -> float:
    """The font size (to a tenth of a point) with the most characters, of (size, characters)
    pairs; 0 for none."""
    counts: Counter[float] = Counter()
    for size, characters in sizes:
        counts[round(size, 1)] += characters
    return max(counts, key=lambda size: counts[size], default=0.0)


def margin_key(text: str) -> str:
    """A line as running headers and footers repeat it: digits masked (page numbers), case
    and spacing ignored."""
    return " ".join(_DIGITS.sub("#", text).split()).casefold()


def group_lines(words: Iterable[Word]) -> list[Line]:
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


def marked_margins(lines: list[Line]) -> list[Line]:
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


def _wide_gap(line: Line) -> float:
    """A gap between words this wide separates table cells: a font size (prose spaces are a
    quarter to half of one)."""
    return max(line.height, 4.0)


def segments(line: Line) -> list[Line]:
    """The line cut at its wide gaps."""
    parts: list[list[Word]] = [[line.words[0]]]
    gap = _wide_gap(line)
    for before, after in zip(line.words, line.words[1:], strict=False):
        if after.x0 - before.x1 >= gap:
            parts.append([after])
        else:
            parts[-1].append(after)
    return [Line(tuple(part)) for part in parts]


def code_lines(lines: Sequence[Line]) -> list[str]:
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
