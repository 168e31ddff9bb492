"""Which blocks of a page are its main content: trafilatura's choice, mapped onto our blocks.

The HTML loader renders a page as Markdown blocks (`html_files`); semantic tags (`nav`, `footer`,
`aside`) tell it what to drop, but many pages build their menus, cookie banners, sidebars,
"related stories" and footers from plain `div`s. trafilatura (a maintained main-content
extractor) recognises those by their class names, link density and position; its own output
loses structure (headings, list items and table rows outside an `<article>`), so it only
decides, and the blocks it kept are ours, in our Markdown:

- a block is kept when trafilatura kept the same words in the same order: at least half of
  its runs of `_SHORT_WORDS` words are runs of trafilatura's text, read as one sequence of
  words (trafilatura keeps the line breaks of the page's source, so a paragraph the source
  wraps is several of its lines; and it may lose a code block's first line);
- a shorter block is kept when trafilatura kept it as a line of its own;
- a structural block (heading, list item, term or definition, table row, code) is also kept
  when the element that holds it (above its list or table, and above wrappers that hold
  nothing else) holds a kept block: a feature list between the paragraphs of a product
  description stays, the "Most read" list in a sidebar goes; the signature table of a Doxygen
  page and the heading DocBook wraps in three `div`s stay beside their text;
- a list item, term or definition whose words are all links' (a menu's entry, a line of a
  table of contents) is kept by its context only: its words name a heading or a page, so
  they are found in the main text wherever the menu is;
- a table row of links only is kept by its words only (`_SHORT_WORDS` or more), never by its
  context: a navigation bar laid out as a table ("[ << ] [ >> ] [Top] [Contents]" in
  texi2html's pages, "Prev Up Next" in DocBook's) sits beside the main text, and trafilatura
  may keep it as a line; a table of package links is kept as trafilatura keeps it;
- the page's first `<h1>` stays: it is the page's own heading.

When trafilatura finds nothing, or keeps too little to trust (under `MIN_SHARE` of the page's
text and under `MIN_CHARS`: a short notice, a page that is mostly a table it set aside), every
block is kept, as before trafilatura.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import trafilatura
from bs4 import Tag
from bs4.element import NavigableString, PageElement

log = logging.getLogger(__name__)

MIN_SHARE = 0.25
MIN_CHARS = 500
# A block this short is kept only when trafilatura kept it as a line of its own: a few words
# ("Share", "Note") are found inside any article.
_SHORT_WORDS = 4
_WORD = re.compile(r"\w+")
TRAFILATURA_OPTIONS: Mapping[str, Any] = MappingProxyType(
    {
        "output_format": "txt",
        "favor_precision": True,
        "include_tables": True,
        "include_comments": True,
        "include_links": False,
        "include_images": False,
        "deduplicate": False,
        "with_metadata": False,
    }
)
"""What trafilatura is asked for: its plain text, tables and comments in, links and images out."""
# Structural blocks that are a menu's entries when all their words are links'.
_ENTRIES = frozenset({"li", "dt", "dd"})
# The page around its layout: the body, and what holds it.
_PAGE = frozenset({"body", "html", "[document]"})
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
    lines = {" ".join(_words(line)) for line in chosen.splitlines()} - {""}
    runs = set(_runs(_words(chosen)))
    elements = _Elements()
    kept = [_kept_by_text(_words(b.text), b, lines, runs, elements) for b in blocks]
    context = _ancestors(b.source for b, keep in zip(blocks, kept, strict=True) if keep)
    first_h1 = next((b for b in blocks if b.source.name == "h1"), None)
    result = [
        b
        for b, keep in zip(blocks, kept, strict=True)
        if keep or b is first_h1 or _in_context(b, context, elements)
    ]
    if _too_little(result, blocks):
        return list(blocks)
    return result


def _chosen_text(html: str) -> str | None:
    try:
        return trafilatura.extract(html, **TRAFILATURA_OPTIONS)
    except MemoryError:
        raise
    except Exception:  # a page trafilatura cannot read is still ours to render
        log.warning("main-content extraction failed; keeping every block", exc_info=True)
        return None


def _words(text: str) -> list[str]:
    return _WORD.findall(text.casefold())


def _runs(words: Sequence[str]) -> Iterator[int]:
    """A hash of each run of `_SHORT_WORDS` words in `words`."""
    return (hash(tuple(words[i : i + _SHORT_WORDS])) for i in range(len(words) - _SHORT_WORDS + 1))


def _kept_by_text(
    words: list[str], block: Block, lines: set[str], runs: set[int], elements: _Elements
) -> bool:
    if not words:
        return False
    if len(words) < _SHORT_WORDS:
        return " ".join(words) in lines and not elements.links_only(block.source)
    if block.source.name in _ENTRIES and elements.links_only(block.source):
        return False
    found = sum(1 for run in _runs(words) if run in runs)
    return 2 * found >= len(words) - _SHORT_WORDS + 1


def _in_context(block: Block, context: set[int], elements: _Elements) -> bool:
    if not block.structural:
        return False
    if block.source.name == "tr" and elements.links_only(block.source):
        return False
    return id(elements.holder(block.source)) in context


class _Elements:
    """What is asked of a block's element, answered once per element: a list item of a
    thousand paragraphs is a thousand blocks of one element."""

    def __init__(self) -> None:
        self._links_only: dict[int, bool] = {}
        self._holders: dict[int, Tag] = {}

    def links_only(self, tag: Tag) -> bool:
        """Whether every word of the element is a link's."""
        if id(tag) not in self._links_only:
            linked = sum(len(_words(link.get_text())) for link in tag.find_all("a"))
            self._links_only[id(tag)] = linked > 0 and linked == len(_words(tag.get_text()))
        return self._links_only[id(tag)]

    def holder(self, tag: Tag) -> Tag:
        """The element whose content gives a structural block its context: above the lists
        and tables the block is in, and above the wrappers that hold nothing else (DocBook's
        three `div`s around each heading, Doxygen's around each signature), but not above a
        wrapper in the page's body (a navigation bar's, a footer's). Each element on the way
        up remembers the answer: the items of one list climb the same way."""
        passed: list[Tag] = []
        child, parent = tag, tag.parent
        while isinstance(parent, Tag) and id(child) not in self._holders:
            passed.append(child)
            if parent.name not in _HOLDERS and (not _only(child, parent) or _page(parent.parent)):
                break
            child, parent = parent, parent.parent
        if id(child) in self._holders:
            found = self._holders[id(child)]
        elif isinstance(parent, Tag):
            found = parent
        else:
            return tag  # an element outside any page
        for element in passed:
            self._holders[id(element)] = found
        return found


def _page(tag: Tag | None) -> bool:
    return tag is None or tag.name in _PAGE


def _only(child: Tag, parent: Tag) -> bool:
    """Whether `child` is all that `parent` shows."""
    return not any(sibling is not child and _shows_text(sibling) for sibling in parent.children)


def _shows_text(node: PageElement) -> bool:
    if isinstance(node, Tag):
        return any(text.strip() for text in node.strings)
    return isinstance(node, NavigableString) and bool(node.strip())


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
