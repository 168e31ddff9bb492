"""Building a structured format's Markdown text: blocks, headings and tables, with offsets.

Slides, sheets and numbered rows are cited by where they start in the text, so the text is
built a block at a time and each block's offset is known when it is written. Blocks are cleaned
(`clean_text`) as they are added, never the joined whole, so the offsets stay true; and the
text's length is checked as it grows, so a huge file fails early, with the usual message,
rather than after its whole text is built.

Tables have the shape the chunker keeps whole per row and repeats the header of, written by
`ingest.loaders.tables`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ingest.loaders.cleaning import clean_text, collapse
from ingest.loaders.parsing import ParseError
from ingest.loaders.tables import separator_line, table_line
from ragservice.limits.documents import DocumentLimits

BLOCK_SEPARATOR = "\n\n"


def over_the_limit(limits: DocumentLimits) -> ParseError:
    return ParseError(
        f"the text is over {limits.max_chars} characters (RAGSERVICE_MAX_DOCUMENT_CHARS)"
    )


def too_many_pages(count: int, what: str, limits: DocumentLimits) -> ParseError:
    """`what` names the pages: "slides", "sheets"."""
    return ParseError(
        f"the file has {count} {what}; the limit is {limits.max_pages} "
        "(RAGSERVICE_MAX_DOCUMENT_PAGES)"
    )


class MarkdownText:
    """A text built of blocks joined by a blank line; it knows each block's offset and refuses
    to grow past the limit."""

    def __init__(self, limits: DocumentLimits) -> None:
        self._limits = limits
        self._parts: list[str] = []
        self._length = 0

    @property
    def end(self) -> int:
        """Where the text so far ends (where a page with no text starts)."""
        return self._length

    @property
    def next_start(self) -> int:
        """Where the next non-empty block will start."""
        return self._length + (len(BLOCK_SEPARATOR) if self._parts else 0)

    def add(self, block: str) -> int:
        """Append `block`, cleaned (nothing if it is blank); the offset where it starts."""
        return self._append(clean_text(block).strip("\n"))

    def heading(self, level: int, text: str) -> int:
        """A `#` heading of `text` on one line (`level` 1 to 6); its offset."""
        return self._append("#" * min(max(level, 1), 6) + " " + collapse(clean_text(text)))

    def table(self, header: Sequence[str], rows: Sequence[tuple[int, Sequence[str]]]) -> list[int]:
        """A table of escaped cells (`cell_text`) with `header` and numbered `rows` (number,
        cells); the offset of each row's line, in order."""
        width = max([len(header), *(len(cells) for _, cells in rows), 1])
        lines = [table_line(header, width), separator_line(width)]
        lines += [table_line(cells, width) for _, cells in rows]
        start = self._append("\n".join(lines))
        offsets: list[int] = []
        position = start + len(lines[0]) + 1 + len(lines[1]) + 1
        for line in lines[2:]:
            offsets.append(position)
            position += len(line) + 1
        return offsets

    def text(self) -> str:
        return BLOCK_SEPARATOR.join(self._parts)

    def _append(self, block: str) -> int:
        if not block.strip():
            return self.next_start
        start = self.next_start
        if start + len(block) > self._limits.max_chars:
            raise over_the_limit(self._limits)
        self._parts.append(block)
        self._length = start + len(block)
        return start
