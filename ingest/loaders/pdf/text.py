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
from dataclasses import dataclass

from ingest.loaders.pdf.layout import PageLayout, Piece

_WORD = re.compile(r"[^\W\d_]+(?:-[^\W\d_]+)*")
_BROKEN = re.compile(r"([^\W\d_]+)-$")
_STARTS_LOWER = re.compile(r"([^\W\d_]+)(\S*)")
_MARKDOWN_START = re.compile(r"^(#|```|~~~)")
# Dot leaders (". . . ." or "....") to a page number, arabic or roman, at the line's end.
LEADERS = re.compile(r"(?:\.\s?){4,}\s*(?:\d+|[ivxlc]+)(?:,\s*\d+)*\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class DocumentText:
    pages: list[str]
    markdown: bool
    dropped: int
    """Lines left out: running headers and footers, entries of a contents or an index."""


def repeats(pages: int) -> int:
    """On how many pages a top or bottom line must recur to be a running header or footer."""
    return max(2, math.ceil(pages / 4))


def compose(pages: Sequence[PageLayout]) -> DocumentText:
    """Each page's text: its pieces less running headers and footers, hyphenation joined,
    prose escaped where the document is Markdown."""
    furniture = _furniture(pages)
    vocabulary = _Vocabulary(pages)
    markdown = any(page.tables or page.code for page in pages)
    texts: list[str] = []
    dropped = 0
    for page in pages:
        kept = [p for p in page.pieces if p.margin is None or p.margin not in furniture]
        kept = [p for p in kept if p.kind != "line" or not LEADERS.search(p.text)]
        dropped += len(page.pieces) - len(kept)
        texts.append(_page_text(_joined(kept, vocabulary), markdown))
    return DocumentText(texts, markdown, dropped)


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
        out[-1] = Piece(head, previous.kind, previous.paragraph, previous.margin)
        rest = piece.text[start.end() :].lstrip()
        if rest:
            out.append(Piece(rest, piece.kind, False, piece.margin))
    return out


def _page_text(pieces: Sequence[Piece], markdown: bool) -> str:
    return "".join(_parts(pieces, markdown))


def _parts(pieces: Sequence[Piece], markdown: bool) -> Iterator[str]:
    previous: Piece | None = None
    for piece in pieces:
        if previous is not None:
            apart = piece.paragraph or piece.kind != "line" or previous.kind != "line"
            yield "\n\n" if apart else "\n"
        text = piece.text
        if markdown and piece.kind == "line" and _MARKDOWN_START.match(text):
            text = "\\" + text
        yield text
        previous = piece
