"""A PDF's pages as text, from their laid-out pieces (`layout`), seen as a whole document.

What one page cannot tell, the document can:

- **Running headers and footers**: a page's top-most or bottom-most line whose text (digits
  masked: page numbers) recurs at the top or bottom of `repeats(pages)` pages or more is the
  document's furniture, not its content, and is dropped (it would repeat in every chunk and
  match every query about the title).
- **Hyphenation**: a word broken by a hyphen at a line's end ("sub-" / "mitted") is joined
  ("submitted") when the next line goes on in lower case: without the hyphen when the
  document writes the word whole elsewhere or nowhere, with it when the document writes it
  with a hyphen elsewhere ("well-known"), and not at all before a capital or a digit.
- **Tables of contents and indexes**: a line that runs to a page number through dot leaders
  ("2.3 Simple parsing . . . . . 4") is the document's own navigation: it matches every
  question about its headings and answers none, so it is left out.
- **Markdown**: a document with a table or a code block is Markdown, so a line of prose that
  starts with `#` or a code fence is escaped: it must not become a heading or a fence.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from ingest.loaders.pdf.blocks import commonest_size
from ingest.loaders.pdf.layout import PageLayout, Piece

_WORD = re.compile(r"[^\W\d_]+(?:-[^\W\d_]+)*")
_BROKEN = re.compile(r"([^\W\d_]+)-$")
_STARTS_LOWER = re.compile(r"([^\W\d_]+)(\S*)")
_MARKDOWN_START = re.compile(r"^(#|```|~~~)")
_DEEPEST = 3
_HEADING_LINES = 2  # a heading wraps over at most this many lines
_LARGER = 1.15  # times the document's text size: a line set this large reads as a heading
_BOLD_SIZE = 0.85  # a bold line set apart this large or more reads as one too
# Dot leaders (". . . ." or "....") to a page number, arabic or roman, at the line's end.
LEADERS = re.compile(r"(?:\.\s?){4,}\s*(?:\d+|[ivxlc]+)(?:,\s*\d+)*\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class DocumentText:
    pages: list[str]
    markdown: bool


def repeats(pages: int) -> int:
    """On how many pages a top or bottom line must recur to be a running header or footer."""
    return max(2, math.ceil(pages / 4))


def compose(pages: Sequence[PageLayout]) -> DocumentText:
    """Each page's text: its pieces less running headers and footers, hyphenation joined,
    headings marked, prose escaped where the document is Markdown."""
    furniture = _furniture(pages)
    vocabulary = _Vocabulary(pages)
    body = _body_size(pages)
    settled = [_settled([_as_heading(p, body) for p in page.pieces]) for page in pages]
    levels = _levels(settled, furniture)
    markdown = bool(levels) or any(page.tables or page.code for page in pages)
    texts: list[str] = []
    for pieces in settled:
        kept = [p for p in pieces if p.margin is None or p.margin not in furniture]
        kept = [p for p in kept if p.kind != "line" or not LEADERS.search(p.text)]
        texts.append(_page_text(_joined(kept, vocabulary), markdown, levels))
    return DocumentText(texts, markdown)


def _furniture(pages: Sequence[PageLayout]) -> set[str]:
    counts = Counter(key for page in pages for key in {p.margin for p in page.pieces if p.margin})
    least = repeats(len(pages))
    return {key for key, count in counts.items() if count >= least and len(pages) > 1}


class _Vocabulary:
    """The document's words as it writes them within lines: whole, and with hyphens."""

    def __init__(self, pages: Sequence[PageLayout]) -> None:
        self.words: set[str] = set()
        for page in pages:
            for piece in page.pieces:
                if piece.kind == "line":
                    # A line's last word may be a broken one: it is no evidence.
                    found = _WORD.findall(piece.text.casefold())
                    self.words.update(found[:-1] if piece.text.endswith("-") else found)

    def join(self, head: str, tail: str) -> str | None:
        """How `head-` at a line's end and `tail` at the next line's start are written
        together; None when they are not one word."""
        if not tail[:1].islower():
            return None
        whole, hyphenated = head + tail, f"{head}-{tail}"
        if whole.casefold() in self.words:
            return whole
        if hyphenated.casefold() in self.words:
            return hyphenated
        return whole


def _joined(pieces: Sequence[Piece], vocabulary: _Vocabulary) -> list[Piece]:
    """The pieces with each word broken across two lines of prose joined on the first."""
    out: list[Piece] = []
    for piece in pieces:
        previous = out[-1] if out else None
        if previous is None or previous.kind != "line" or piece.kind != "line":
            out.append(piece)
            continue
        broken = _BROKEN.search(previous.text)
        start = _STARTS_LOWER.match(piece.text)
        word = vocabulary.join(broken.group(1), start.group(1)) if broken and start else None
        if word is None or broken is None or start is None:
            out.append(piece)
            continue
        head = previous.text[: broken.start()] + word + start.group(2)
        out[-1] = replace(previous, text=head)
        rest = piece.text[start.end() :].lstrip()
        if rest:
            out.append(replace(piece, text=rest, paragraph=False))
    return out


def _body_size(pages: Sequence[PageLayout]) -> float:
    """The font size most of the document's text is set in."""
    return commonest_size(
        (piece.size, len(piece.text))
        for page in pages
        for piece in page.pieces
        if piece.kind == "line" and piece.size > 0
    )


def _as_heading(piece: Piece, body: float) -> Piece:
    """The piece, its `heading` its size where it reads as a heading: shaped as one (`layout`)
    and set larger than the document's text, or bold near its size and set apart."""
    size = piece.size
    larger = size >= _LARGER * body
    strong = piece.bold and piece.apart and size >= _BOLD_SIZE * body
    is_heading = piece.heading and body > 0 and (larger or strong)
    return replace(piece, heading=is_heading)


def _settled(pieces: Sequence[Piece]) -> list[Piece]:
    """The page's pieces with its headings settled: the lines of a heading wrapped over two
    lines joined into one; a run of three or more lines of a heading's size (a larger
    paragraph: an abstract, a title block) and headings of one size one after another with
    nothing between (figure labels, authors' names) read as text, not headings."""
    runs = _heading_runs(pieces)
    refused = {
        index
        for index, (start, end) in enumerate(runs)
        if end - start > _HEADING_LINES
        or (index + 1 < len(runs) and _same_heading(pieces, runs[index], runs[index + 1]))
        or (index > 0 and _same_heading(pieces, runs[index - 1], runs[index]))
    }
    out: list[Piece] = []
    at = 0
    for index, (start, end) in enumerate(runs):
        out.extend(pieces[at:start])
        run = pieces[start:end]
        if index in refused:
            out.extend(replace(piece, heading=False) for piece in run)
        else:
            text = " ".join(piece.text for piece in run)
            out.append(replace(run[0], text=text, paragraph=True))
        at = end
    return out + list(pieces[at:])


def _heading_runs(pieces: Sequence[Piece]) -> list[tuple[int, int]]:
    """Where each run of heading lines of one size, unbroken by a paragraph, starts and ends."""
    runs: list[tuple[int, int]] = []
    index = 0
    while index < len(pieces):
        if not pieces[index].heading:
            index += 1
            continue
        end = index + 1
        while (
            end < len(pieces)
            and pieces[end].heading
            and pieces[end].size == pieces[index].size
            and not pieces[end].paragraph
        ):
            end += 1
        runs.append((index, end))
        index = end
    return runs


def _same_heading(pieces: Sequence[Piece], first: tuple[int, int], then: tuple[int, int]) -> bool:
    """Whether a heading run follows another of the same size with nothing between them."""
    return first[1] == then[0] and pieces[then[0]].size == pieces[first[0]].size


def _levels(pages: Sequence[Sequence[Piece]], furniture: set[str]) -> dict[float, int]:
    """The heading level of each font size the document sets headings in: the largest 1, the
    next 2, and so on, the smaller all `_DEEPEST`."""
    sizes = {
        piece.size
        for pieces in pages
        for piece in pieces
        if piece.heading and piece.margin not in furniture
    }
    return {size: min(rank, _DEEPEST) for rank, size in enumerate(sorted(sizes, reverse=True), 1)}


def _page_text(pieces: Sequence[Piece], markdown: bool, levels: dict[float, int]) -> str:
    return "".join(_parts(pieces, markdown, levels))


def _parts(pieces: Sequence[Piece], markdown: bool, levels: dict[float, int]) -> Iterator[str]:
    previous: Piece | None = None
    for piece in pieces:
        level = levels.get(piece.size, 0) if piece.heading else 0
        if previous is not None:
            apart = piece.paragraph or piece.kind != "line" or previous.kind != "line"
            yield "\n\n" if apart or level or previous.heading else "\n"
        text = piece.text
        if level:
            text = "#" * level + " " + text
        elif markdown and piece.kind == "line" and _MARKDOWN_START.match(text):
            text = "\\" + text
        yield text
        previous = piece
