"""Which blocks of a page are its main content: trafilatura's choice, mapped onto our blocks.

The HTML loader renders a page as Markdown blocks (`html_files`); semantic tags (`nav`, `footer`,
`aside`) tell it what to drop, but many pages build their menus, cookie banners, sidebars,
"related stories" and footers from plain `div`s. trafilatura (a maintained main-content
extractor) recognises those by their class names, link density and position; its own output
loses structure (headings, list items and table rows outside an `<article>`), so it only
decides, and the blocks it kept are ours, in our Markdown:

- a block of running text is kept when trafilatura kept the same words;
- a structural block (heading, list item, table row, code) is also kept when the element that
  holds it (the list's, the table's or its own parent) holds kept text: a feature list between
  the paragraphs of a product description stays, the "Most read" list in a sidebar goes;
- the page's first `<h1>` stays: it is the page's own heading.

When trafilatura finds nothing, or keeps too little to trust (under `MIN_SHARE` of the page's
text and under `MIN_CHARS`: a short notice, a page that is mostly a table it set aside), every
block is kept, as before trafilatura.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import trafilatura
from bs4 import Tag

log = logging.getLogger(__name__)

MIN_SHARE = 0.25
MIN_CHARS = 500
# A block this short is kept only when trafilatura kept it as a line of its own: a few words
# ("Share", "Note") are found inside any article.
_SHORT_WORDS = 4
_WORD = re.compile(r"\w+")
# Elements that hold a structural block without being its context.
_HOLDERS = frozenset({"ul", "ol", "li", "table", "thead", "tbody", "tfoot", "tr", "dl", "pre"})


@dataclass(frozen=True)
class Block:
    """One Markdown block and the element it was read from (running text: its container)."""

    text: str
    source: Tag
    structural: bool = False


def main_blocks(blocks: Sequence[Block], html: str) -> list[Block]:
    """The blocks of the page's main content; all of them when trafilatura cannot tell."""
    chosen = _chosen_text(html)
    if not chosen:
        return list(blocks)
    lines = {_key(line) for line in chosen.splitlines()} - {""}
    chosen_words = f" {' '.join(lines)} "
    kept = [_kept_by_text(b, lines, chosen_words) for b in blocks]
    context = _ancestors(b.source for b, keep in zip(blocks, kept, strict=True) if keep)
    first_h1 = next((b for b in blocks if b.source.name == "h1"), None)
    result = [
        b
        for b, keep in zip(blocks, kept, strict=True)
        if keep or b is first_h1 or (b.structural and id(_holder(b.source)) in context)
    ]
    if _too_little(result, blocks):
        return list(blocks)
    return result


def _chosen_text(html: str) -> str | None:
    try:
        return trafilatura.extract(
            html,
            output_format="txt",
            favor_precision=True,
            include_tables=True,
            include_comments=True,
            include_links=False,
            include_images=False,
            deduplicate=False,
            with_metadata=False,
        )
    except MemoryError:
        raise
    except Exception:  # a page trafilatura cannot read is still ours to render
        log.warning("main-content extraction failed; keeping every block", exc_info=True)
        return None


def _key(text: str) -> str:
    return " ".join(_WORD.findall(text.casefold()))


def _kept_by_text(block: Block, lines: set[str], chosen_words: str) -> bool:
    key = _key(block.text)
    if not key:
        return False
    if key.count(" ") + 1 < _SHORT_WORDS:
        return key in lines
    return f" {key} " in chosen_words


def _holder(tag: Tag) -> Tag:
    """The element whose content gives a structural block its context."""
    parent = tag.parent
    while isinstance(parent, Tag) and parent.name in _HOLDERS:
        parent = parent.parent
    return parent if isinstance(parent, Tag) else tag


def _ancestors(sources: Iterable[Tag]) -> set[int]:
    """The ids of the given elements and of every element above them."""
    seen: set[int] = set()
    for source in sources:
        node: Tag | None = source
        while node is not None and id(node) not in seen:  # above a seen node: all seen
            seen.add(id(node))
            node = node.parent
    return seen


def _too_little(kept: Sequence[Block], blocks: Sequence[Block]) -> bool:
    kept_chars = sum(len(b.text) for b in kept)
    all_chars = sum(len(b.text) for b in blocks)
    return kept_chars < MIN_CHARS and kept_chars < MIN_SHARE * all_chars
