"""Split a document's text into chunks that fit an embedding model's token budget.

Chunks follow the text's own structure. Whole paragraphs are packed together; a stretch too
long for one chunk is cut at the coarsest boundary that fits (paragraph, line, sentence, word,
then token). Markdown headings start sections that no chunk crosses. The document is tokenized
once and the token count of any character range comes from bisecting the token spans, so
chunking costs little beyond that single tokenizer call.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import accumulate
from typing import Any, NamedTuple

from ragservice.types import PageSpan, PageUnit, TextChunk, TextFormat, Tokenizer

# A boundary tier is a few sorted lists of character positions; a tier's candidates are their
# union. Keeping the lists apart avoids merging (and sorting) them for every document.
_Tier = tuple[list[int], ...]

_NEWLINE_RUN = re.compile(r"\n\s*")
_WORD_BREAK = re.compile(r"\s+")
# A sentence ends at . ! ? or ; before whitespace, or at a CJK full stop, exclamation or question
# mark anywhere; closing quotes and brackets stay with it. A pattern that opens with one
# character class scans fast; `_Boundaries._sentences` checks the whitespace rule per match.
_STOPS = ".!?;\u3002\uff01\uff1f"
_CLOSERS = "\"'\u2019\u201d\u00bb)\\]\u300d\u300f\uff09"
_SENTENCE_BREAK = re.compile(f"[{_STOPS}][{_STOPS}{_CLOSERS}]*(\\s*)")
_CJK_STOPS = frozenset("\u3002\uff01\uff1f")
_LEADING_SPACE = re.compile(r"\s*")
_NON_SPACE = re.compile(r"\S")

_MARKDOWN_LINE = re.compile(
    r"^(?:(?P<fence>\ {0,3}(?:`{3,}|~{3,}))(?P<info>[^\n]*)"
    r"|(?P<hashes>\#{1,6})[ \t]+(?P<title>[^\n]*))",
    re.MULTILINE,
)
_CLOSING_HASHES = re.compile(r"(?:^|[ \t])#+[ \t]*$")
_LINE = re.compile(r"[^\n]+")
_TABLE_RULE = re.compile(r"\|(?:[ \t]*:?-{3,}:?[ \t]*\|)+[ \t]*")

TABLE_HEADER = "table_header"
"""Chunk metadata: the header (and separator) lines of the table a chunk's rows belong to,
which the chunk's text repeats before them, since the header lies in an earlier chunk."""


def repeat_header(header: str, rows: str) -> str:
    """A chunk's text that repeats its table's header before its rows."""
    return f"{header}\n{rows}"


def own_text(text: str, metadata: Mapping[str, Any]) -> str:
    """A chunk's text without the table header it repeats: the slice of its document that
    `start_char:end_char` names."""
    header = metadata.get(TABLE_HEADER)
    if isinstance(header, str) and text.startswith(header + "\n"):
        return text[len(header) + 1 :]
    return text


@dataclass(frozen=True, slots=True)
class ChunkingOptions:
    """Token budget of one chunk and how many tokens consecutive chunks share.

    The default budget plus the two special tokens a BERT-style encoder adds ([CLS], [SEP])
    is 256, the maximum sequence of all-MiniLM-L6-v2.
    """

    max_tokens: int = 254
    overlap_tokens: int = 32

    def __post_init__(self) -> None:
        if self.max_tokens < 8:
            raise ValueError(f"max_tokens must be at least 8, got {self.max_tokens}")
        if not 0 <= self.overlap_tokens < self.max_tokens // 2:
            raise ValueError(
                f"overlap_tokens must be in [0, {self.max_tokens // 2}), got {self.overlap_tokens}"
            )


class HFTokenizer:
    """Adapt a Hugging Face *fast* tokenizer (only those report offsets) to `Tokenizer`.

    BERT-style tokenizers leave whitespace out of every span; chunking expects exactly that.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        """Return the character span of each token of `text`, without special tokens."""
        # verbose=False: a whole document is longer than the model reads, which is the point here.
        encoding = self._tokenizer(
            text, add_special_tokens=False, return_offsets_mapping=True, verbose=False
        )
        return [(int(start), int(end)) for start, end in encoding["offset_mapping"]]


def chunk_text(
    text: str,
    *,
    tokenizer: Tokenizer,
    options: ChunkingOptions,
    format: TextFormat = "text",
    page_starts: Sequence[int] = (),
) -> list[TextChunk]:
    """Cut `text` into chunks of at most `options.max_tokens` tokens, in document order.

    Offsets index the original `text`; each chunk is trimmed of surrounding whitespace.
    With `format="markdown"` chunks stay inside one heading section and carry its heading
    path as `metadata["headings"]`. With `page_starts` (where each page starts in `text`)
    each chunk carries the pages it lies on.
    """
    if not text or text.isspace():
        return []
    splitter = _Splitter(text, _TokenIndex(tokenizer.token_spans(text)), options)
    sections = _markdown_sections(text) if format == "markdown" else [_Section(0, len(text))]
    pieces = [piece for section in sections for piece in splitter.section_pieces(section)]
    return [
        splitter.make_chunk(ordinal, piece, page_span(page_starts, piece.start, piece.end))
        for ordinal, piece in enumerate(pieces)
    ]


def place_chunks(
    chunks: list[TextChunk],
    unit: PageUnit,
    page_names: Sequence[str] = (),
    row_starts: Sequence[tuple[int, int]] = (),
) -> list[TextChunk]:
    """Chunks that say where they lie beyond page numbers, in their metadata and their span:
    `page_unit` (slides, sheets), the sheet's name (`sheet`) and the numbered rows they hold
    (`rows`, [first, last]) — what a citation names (`PageSpan.label`). Page chunks stay as
    they are."""
    if unit == "page" and not row_starts:
        return chunks
    rows_by_place = _Rows(row_starts)
    placed: list[TextChunk] = []
    for chunk in chunks:
        metadata = dict(chunk.metadata)
        if unit != "page":
            metadata["page_unit"] = unit
        pages = chunk.pages
        if pages is not None and pages.first == pages.last and pages.first <= len(page_names):
            metadata["sheet"] = page_names[pages.first - 1]
        rows = rows_by_place.between(chunk.start_char, chunk.end_char)
        if rows is not None:
            metadata["rows"] = list(rows)
        if pages is not None:
            pages = PageSpan.of_chunk(pages.first, pages.last, metadata)
        placed.append(replace(chunk, metadata=metadata, pages=pages))
    return placed


def rows_of(row_starts: Sequence[tuple[int, int]], start: int, end: int) -> tuple[int, int] | None:
    """The first and last numbered row (`LoadedDocument.row_starts`) that starts within the
    text range [start, end); None when none does."""
    return _Rows(row_starts).between(start, end)


class _Rows:
    """A document's numbered rows, their offsets split out once for bisecting (a workbook has
    many rows, and every chunk looks its rows up)."""

    def __init__(self, row_starts: Sequence[tuple[int, int]]) -> None:
        self._offsets = [offset for offset, _ in row_starts]
        self._numbers = [number for _, number in row_starts]

    def between(self, start: int, end: int) -> tuple[int, int] | None:
        low, high = bisect_left(self._offsets, start), bisect_left(self._offsets, end)
        if low >= high:
            return None
        numbers = self._numbers[low:high]
        return min(numbers), max(numbers)


def page_span(page_starts: Sequence[int], start: int, end: int) -> PageSpan | None:
    """The pages (1-based) that the text range [start, end) lies on, given where each page
    starts; None when there are no pages. Of pages that start at the same place (empty
    ones), the range is on the last."""
    if not page_starts:
        return None
    first = max(bisect_right(page_starts, start), 1)
    last = max(bisect_right(page_starts, max(end - 1, start)), first)
    return PageSpan(first, last)


class _TokenIndex:
    """Token spans sorted for bisecting, so counts and cut checks cost O(log n)."""

    __slots__ = ("ends", "starts")

    def __init__(self, spans: Sequence[tuple[int, int]]) -> None:
        starts = [start for start, _ in spans]
        if starts != sorted(starts):
            spans = sorted(spans)
            starts = [start for start, _ in spans]
        ends = [end for _, end in spans]
        self.starts = starts
        # A running maximum keeps `ends` sorted even if a tokenizer reports nested spans;
        # bisecting it is only valid while it is sorted.
        self.ends = ends if ends == sorted(ends) else list(accumulate(ends, _larger))

    def count(self, start: int, end: int) -> int:
        """Number of tokens whose span lies inside [start, end)."""
        return max(0, bisect_right(self.ends, end) - bisect_left(self.starts, start))

    def first_at(self, pos: int) -> int:
        """Index of the first token that starts at or after `pos`."""
        return bisect_left(self.starts, pos)

    def is_cut(self, pos: int) -> bool:
        """Whether cutting the text at `pos` leaves every token whole."""
        before = bisect_left(self.starts, pos)
        return before == 0 or self.ends[before - 1] <= pos


def _larger(a: int, b: int) -> int:
    return a if a > b else b


class _Breaks(NamedTuple):
    """Both sides of each break of one kind, as sorted character positions."""

    ends: list[int]  # where the text before the break ends (a chunk may end here)
    starts: list[int]  # where the text after it starts (an overlapping chunk may start here)


class _Boundaries:
    """Where a chunk may end or start, found lazily since most documents need few tiers."""

    def __init__(self, text: str) -> None:
        self._text = text

    def end_tiers(self) -> Iterator[_Tier]:
        """Positions where a chunk may end, coarsest tier first."""
        yield (self._paragraph_ends,)
        yield (self._lines.ends,)
        yield (self._lines.ends, self._sentences.ends)
        # CJK sentence ends need no following space, so they also count as word ends.
        yield (self._words.ends, self._sentences.ends)

    def start_tiers(self) -> Iterator[_Tier]:
        """Positions where an overlapping chunk may start, coarsest tier first."""
        yield (self._lines.starts, self._sentences.starts)
        yield (self._words.starts,)

    @cached_property
    def _lines(self) -> _Breaks:
        text, ends, starts = self._text, [], []
        for match in _NEWLINE_RUN.finditer(text):
            # The run may begin with spaces (or the \r of \r\n) before its first newline.
            end = match.start()
            while end > 0 and text[end - 1].isspace():
                end -= 1
            ends.append(end)
            starts.append(match.end())
        return _Breaks(ends, starts)

    @cached_property
    def _paragraph_ends(self) -> list[int]:
        # Two newlines in one whitespace run always enclose a blank line.
        lines, text = self._lines, self._text
        return [
            e for e, s in zip(lines.ends, lines.starts, strict=True) if text.count("\n", e, s) > 1
        ]

    @cached_property
    def _sentences(self) -> _Breaks:
        ends, starts = [], []
        for match in _SENTENCE_BREAK.finditer(self._text):
            end, start = match.span(1)
            if start > end or not _CJK_STOPS.isdisjoint(match.group()):
                ends.append(end)
                starts.append(start)
        return _Breaks(ends, starts)

    @cached_property
    def _words(self) -> _Breaks:
        runs = [match.span() for match in _WORD_BREAK.finditer(self._text)]
        return _Breaks([end for end, _ in runs], [start for _, start in runs])


class _Splitter:
    """Cuts character ranges of one document into chunk spans under the token budget."""

    def __init__(self, text: str, index: _TokenIndex, options: ChunkingOptions) -> None:
        self._text = text
        self._index = index
        self._max = options.max_tokens
        self._overlap = options.overlap_tokens
        self._boundaries = _Boundaries(text)

    def make_chunk(self, ordinal: int, piece: _Piece, pages: PageSpan | None) -> TextChunk:
        start, end = piece.start, piece.end
        metadata: dict[str, Any] = {}
        if piece.headings is not None:
            metadata["headings"] = list(piece.headings)
        text, tokens = self._text[start:end], self._index.count(start, end)
        if piece.header is not None:
            metadata[TABLE_HEADER] = self._text[piece.header[0] : piece.header[1]]
            text = repeat_header(metadata[TABLE_HEADER], text)
            tokens += self._index.count(*piece.header)
        return TextChunk(
            ordinal=ordinal,
            text=text,
            start_char=start,
            end_char=end,
            token_count=tokens,
            metadata=metadata,
            pages=pages,
        )

    def section_pieces(self, section: _Section) -> list[_Piece]:
        """The pieces of one section: its tables cut between rows, the rest as `split` cuts."""
        headings = section.headings
        tables = _tables(self._text, section) if headings is not None else []
        if not tables or self._index.count(section.start, section.end) <= self._max:
            return [_Piece(s, e, headings) for s, e in self.split(section.start, section.end)]
        pieces: list[_Piece] = []
        at = section.start
        for table in tables:
            before = [_Piece(s, e, headings) for s, e in self.split(at, table.start)]
            lead = table.start
            # A short lead-in (the sheet's heading, a caption) goes with the table's first rows.
            if before and self._fits(before[-1].start, table.rows[0][1]):
                lead = before.pop().start
            pieces += before
            pieces += self._table_pieces(table, lead, headings)
            at = table.end
        pieces += [_Piece(s, e, headings) for s, e in self.split(at, section.end)]
        return pieces

    def _fits(self, start: int, end: int, extra: int = 0) -> bool:
        return self._index.count(start, end) + extra <= self._max

    def _table_pieces(
        self, table: _Table, lead: int, headings: tuple[str, ...] | None
    ) -> list[_Piece]:
        """A table's rows packed into pieces; every piece after the first repeats the header.
        A row too long for a chunk of its own is cut as text is (the only mid-row cut)."""
        header = (table.start, table.header_end)
        header_tokens = self._index.count(*header)
        if not self._fits(lead, table.rows[0][1]):
            return [_Piece(s, e, headings) for s, e in self.split(lead, table.end)]
        pieces: list[_Piece] = []
        start: int | None = lead
        end, repeated = table.rows[0][1], False
        for row_start, row_end in table.rows[1:]:
            if start is not None and self._fits(start, row_end, header_tokens if repeated else 0):
                end = row_end
                continue
            if start is not None:
                pieces.append(_Piece(start, end, headings, header if repeated else None))
            start, end, repeated = row_start, row_end, True
            if not self._fits(row_start, row_end, header_tokens):
                pieces += [_Piece(s, e, headings) for s, e in self.split(row_start, row_end)]
                start = None
        if start is not None:
            pieces.append(_Piece(start, end, headings, header if repeated else None))
        return pieces

    def split(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Cut [lo, hi) into trimmed, overlapping (start, end) spans, each within budget."""
        start, hi = self._trim(lo, hi)
        if start >= hi:
            return []
        spans = [self._trim(start, self._choose_end(start, start, hi))]
        while spans[-1][1] < hi:
            prev_start, prev_end = spans[-1]
            start = self._next_start(prev_start, prev_end)
            # Every chunk must take in at least the first character the previous one lacked.
            fresh = self._skip_space(prev_end)
            spans.append(self._trim(start, self._choose_end(start, fresh, hi)))
        return spans

    def _trim(self, start: int, end: int) -> tuple[int, int]:
        start = self._skip_space(start, end)
        return start, start + len(self._text[start:end].rstrip())

    def _skip_space(self, pos: int, end: int | None = None) -> int:
        match = _LEADING_SPACE.match(self._text, pos, len(self._text) if end is None else end)
        return pos if match is None else match.end()

    def _choose_end(self, start: int, fresh: int, hi: int) -> int:
        """End of the chunk that starts at `start`: beyond `fresh`, within budget, coarsest."""
        if self._index.count(start, hi) <= self._max:
            return hi
        first = self._index.first_at(start)
        # Any cut at or before `limit` keeps token first + max_tokens out of the chunk.
        limit = self._index.ends[first + self._max] - 1
        for tier in self._boundaries.end_tiers():
            cut = self._furthest(tier, fresh, limit)
            if cut is not None and self._worth_cutting(start, cut, tier, hi):
                return cut
        return self._token_cut(first, fresh, limit)

    def _furthest(self, tier: _Tier, fresh: int, limit: int) -> int | None:
        """The last position of `tier` in (fresh, limit] that splits no token, if any."""
        best: int | None = None
        for positions in tier:
            i = bisect_right(positions, limit) - 1
            while i >= 0 and positions[i] > fresh and not self._index.is_cut(positions[i]):
                i -= 1
            if i >= 0 and positions[i] > fresh and (best is None or positions[i] > best):
                best = positions[i]
        return best

    def _worth_cutting(self, start: int, cut: int, tier: _Tier, hi: int) -> bool:
        # A coarse cut that leaves the chunk under half full only pays off when the next unit
        # then stays whole; otherwise a title or heading would sit alone in a tiny chunk.
        if 2 * self._index.count(start, cut) >= self._max:
            return True
        following = min(_next_after(positions, cut, hi) for positions in tier)
        return self._index.count(cut, following) <= self._max - self._overlap

    def _token_cut(self, first: int, fresh: int, limit: int) -> int:
        """Cut between tokens, preferring a gap or punctuation to the inside of a word."""
        last = first + self._max - 1
        cuts = [
            k
            for k in range(last, max(first, last - self._max // 4) - 1, -1)
            if fresh < self._index.ends[k] <= limit and self._index.is_cut(self._index.ends[k])
        ]
        if cuts:
            ends = self._index.ends
            return next((ends[k] for k in cuts if self._is_clean(ends[k])), ends[cuts[0]])
        # Only a tokenizer whose spans share ends gets here; cut anyway to keep moving.
        return max(limit, fresh + 1)

    def _is_clean(self, pos: int) -> bool:
        # Word pieces re-tokenize differently once a chunk starts mid-word, so the count
        # measured here would drift; a cut next to a space or punctuation re-tokenizes the same.
        text = self._text
        return not (0 < pos < len(text) and text[pos - 1].isalnum() and text[pos].isalnum())

    def _next_start(self, prev_start: int, prev_end: int) -> int:
        """Start of the next chunk: up to `overlap_tokens` back, snapped to a sentence or word."""
        first = self._index.first_at(prev_start)
        last = bisect_right(self._index.ends, prev_end)
        # Never share more than half of a short previous chunk, so chunks keep advancing.
        overlap = min(self._overlap, (last - first) // 2)
        if overlap == 0:
            return prev_end
        window = self._index.starts[last - overlap]
        start = self._snap_start(window, prev_end)
        return start if start > prev_start else prev_end

    def _snap_start(self, window: int, prev_end: int) -> int:
        """The first sentence, word or clean token start at or after `window`."""
        for tier in self._boundaries.start_tiers():
            found = self._earliest(tier, window, prev_end)
            if found is not None:
                return found
        starts = self._index.starts
        tokens = range(bisect_left(starts, window), bisect_left(starts, prev_end))
        return next((starts[k] for k in tokens if self._is_clean(starts[k])), window)

    def _earliest(self, tier: _Tier, window: int, prev_end: int) -> int | None:
        """The first position of `tier` in [window, prev_end) that splits no token, if any."""
        best: int | None = None
        for positions in tier:
            i = bisect_left(positions, window)
            while i < len(positions) and positions[i] < prev_end:
                if self._index.is_cut(positions[i]):
                    if best is None or positions[i] < best:
                        best = positions[i]
                    break
                i += 1
        return best


def _next_after(positions: list[int], pos: int, hi: int) -> int:
    i = bisect_right(positions, pos)
    return min(positions[i], hi) if i < len(positions) else hi


@dataclass(frozen=True, slots=True)
class _Piece:
    """A chunk's range of the text, its heading path, and the range of the table header it
    repeats (None: it repeats nothing)."""

    start: int
    end: int
    headings: tuple[str, ...] | None
    header: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class _Table:
    """A Markdown table in the text: its header and separator lines, then one line per row."""

    start: int
    header_end: int
    rows: list[tuple[int, int]]

    @property
    def end(self) -> int:
        return self.rows[-1][1]


def _tables(text: str, section: _Section) -> list[_Table]:
    """The Markdown tables of a section that have at least one row (outside code fences the
    section never holds: a fence opened in it hides nothing a loader writes as a table)."""
    tables: list[_Table] = []
    lines = [(m.start(), m.end()) for m in _LINE.finditer(text, section.start, section.end)]
    i = 0
    while i + 2 < len(lines):
        header, separator = lines[i], lines[i + 1]
        if not (_is_row(text, header) and _TABLE_RULE.fullmatch(text, *separator)):
            i += 1
            continue
        j = i + 2
        while j < len(lines) and _is_row(text, lines[j]):
            j += 1
        if j > i + 2:
            tables.append(_Table(header[0], separator[1], lines[i + 2 : j]))
        i = j
    return tables


def _is_row(text: str, line: tuple[int, int]) -> bool:
    start, end = line
    return text.startswith("|", start) and text[start:end].rstrip().endswith("|")


@dataclass(frozen=True, slots=True)
class _Section:
    """A character range chunked on its own; `headings` is None for plain text."""

    start: int
    end: int
    headings: tuple[str, ...] | None = None


def _markdown_sections(text: str) -> list[_Section]:
    """Split at ATX headings outside fenced code; each section starts with its heading line."""
    heads = _headings(text)
    starts = [0, *(start for start, _ in heads)]
    paths: list[tuple[str, ...]] = [(), *(path for _, path in heads)]
    ends = [*starts[1:], len(text)]
    sections = [_Section(s, e, p) for s, e, p in zip(starts, ends, paths, strict=True)]
    return _carry_bare_headings(text, sections)


def _headings(text: str) -> list[tuple[int, tuple[str, ...]]]:
    """(line start, heading path) of every heading; a heading pops same-or-deeper levels."""
    found: list[tuple[int, tuple[str, ...]]] = []
    stack: list[tuple[int, str]] = []
    fence: str | None = None
    for match in _MARKDOWN_LINE.finditer(text):
        if match["fence"] is not None:
            fence = _toggle_fence(fence, match["fence"].lstrip(" "), match["info"])
            continue
        if fence is not None:
            continue
        level = len(match["hashes"])
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, _CLOSING_HASHES.sub("", match["title"].strip()).strip()))
        found.append((match.start(), tuple(title for _, title in stack)))
    return found


def _toggle_fence(open_fence: str | None, marker: str, info: str) -> str | None:
    """The fence open after this fence-like line (CommonMark rules, simplified)."""
    if open_fence is None:
        # A backtick "fence" whose info string holds a backtick is inline code, not a fence.
        return None if marker[0] == "`" and "`" in info else marker
    closes = marker[0] == open_fence[0] and len(marker) >= len(open_fence) and not info.strip()
    return None if closes else open_fence


def _carry_bare_headings(text: str, sections: list[_Section]) -> list[_Section]:
    """Fold each heading without a body into the next section, so it never stands alone."""
    kept: list[_Section] = []
    carried_from: int | None = None
    for i, section in enumerate(sections):
        start = section.start if carried_from is None else carried_from
        if 0 < i < len(sections) - 1 and _is_bare_heading(text, section):
            carried_from = start
            continue
        kept.append(_Section(start, section.end, section.headings))
        carried_from = None
    return kept


def _is_bare_heading(text: str, section: _Section) -> bool:
    line_end = text.find("\n", section.start, section.end)
    return line_end == -1 or _NON_SPACE.search(text, line_end, section.end) is None
