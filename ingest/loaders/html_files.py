"""HTML: the main content as Markdown (headings, list items, table rows, code), without the
navigation, headers, footers, sidebars, banners and scripts around it.

Semantic tags (`nav`, `footer`, `aside`, …), scripts, hidden elements and permalinks (the "¶"
beside each heading) are dropped first; the rest is rendered as blocks, of which `html_main`
keeps those trafilatura finds to be the main content (menus, cookie banners and sidebars built
from plain `div`s go too).
"""

from __future__ import annotations

import codecs
import re
import unicodedata
import warnings
from collections.abc import Iterable, Iterator, Sequence

from bs4 import BeautifulSoup, Tag, XMLParsedAsHTMLWarning
from bs4.element import NavigableString, PageElement, PreformattedString

from ingest.loaders.cleaning import BOMS, clean_text, clean_title, collapse, decode_bytes
from ingest.loaders.html_main import Block, main_blocks
from ingest.loaders.parsing import Parsed, bad_content
from ragservice.limits.documents import DocumentLimits

_DROPPED = (
    "script, style, noscript, nav, header, footer, aside, form, template, iframe, svg, "
    '[role="navigation"], [role="banner"], [role="contentinfo"]'
)
# Inline styles that hide an element (declarations read with their spaces removed).
_HIDDEN_STYLE = re.compile(
    r"(?:^|;)(?:display:none|visibility:(?:hidden|collapse)|opacity:0(?:\.0*)?"
    r"|font-size:0(?:\.0*)?(?:px|pt|em|rem|%)?|clip:rect\(0[^)]*\))(?:!important)?(?:;|$)"
)
_HIDDEN_STYLE_SPACE = re.compile(r"\s+")
_HEADING_LEVELS = {f"h{level}": level for level in range(1, 7)}
# Tags that flow inside a line of text; any other tag starts a block of its own.
# fmt: off
_INLINE_TAGS = frozenset({
    "a", "abbr", "b", "bdi", "bdo", "big", "button", "cite", "code", "data", "del", "dfn", "em",
    "font", "i", "img", "input", "ins", "kbd", "label", "mark", "output", "q", "s", "samp",
    "select", "small", "span", "strike", "strong", "sub", "sup", "time", "tt", "u", "var", "wbr",
})
# fmt: on
_UNRENDERED_TAGS = frozenset({"head", "title", "meta", "link", "base"})
_CHARSET_DECLARATION = re.compile(rb"""charset\s*=\s*(?:["']\s*)?([A-Za-z0-9._:-]+)""", re.I)
# What a permalink shows: Sphinx's "¶", "§", "#", a link or anchor emoji, Doxygen's "◆", a
# footnote's way back "↩" (and an icon font's private-use glyph, as MkDocs' theme shows).
_PERMALINK_SIGNS = frozenset("\u00b6\u00a7#\U0001f517\u2693\u25c6\u21a9\ufe0e\ufe0f")
_PERMALINK_LENGTH = 3
# What an <aside> that is a note says it is (its class, role or epub:type).
_NOTES = ("footnote", "endnote", "rearnote")
# A line of running text that starts so would read as a Markdown heading or code fence.
_MARKDOWN_START = re.compile(r"#|```|~~~")


def parse_html(data: bytes, _limits: DocumentLimits) -> Parsed:
    with bad_content("not a valid HTML file"):
        text, title = html_text(data)
    return Parsed(clean_text(text), title, "markdown")


def html_text(data: bytes, *, main_content: bool = True) -> tuple[str, str | None]:
    """The page's text as Markdown, and its title. `main_content=False` keeps every block the
    tag rules leave (the extraction before `html_main`; benchmarks compare the two)."""
    with warnings.catch_warnings():
        # Meant: lxml's HTML parser forgives what XHTML pages (DocBook's, Texinfo's) get wrong.
        warnings.simplefilter("ignore", XMLParsedAsHTMLWarning)
        soup = BeautifulSoup(_decode_html(data), "lxml")
    _drop_boilerplate(soup)
    blocks = list(_html_blocks(_content_root(soup)))
    if main_content:
        blocks = main_blocks(blocks, str(soup))
    return "\n\n".join(block.text for block in blocks), _html_title(soup)


def _decode_html(data: bytes) -> str:
    declared = _declared_charset(data[:4096])
    if declared is None or data.startswith(tuple(bom for bom, _ in BOMS)):
        return decode_bytes(data)
    try:
        # Valid UTF-8 beats a stale declaration left over from a conversion.
        return clean_text(data.decode("utf-8"))
    except UnicodeDecodeError:
        return clean_text(data.decode(declared, errors="replace"))


def _declared_charset(head: bytes) -> str | None:
    declared = _meta_charset(head)
    if declared is None:
        return None
    try:
        name = codecs.lookup(declared.decode("ascii")).name
    except LookupError:
        return None
    if name == "utf-8":
        return None  # declared UTF-8 that is not valid UTF-8: let detection have a go
    # Browsers read Latin-1 and ASCII labels as windows-1252 (WHATWG Encoding Standard).
    return "cp1252" if name in {"iso8859-1", "ascii"} else name


def _meta_charset(head: bytes) -> bytes | None:
    """The charset named in the first `<meta` tag that names one (the tag's last `charset=`).

    What the regex `<meta[^>]+charset\\s*=\\s*["']?\\s*([A-Za-z0-9._:-]+)` finds, in linear
    time: searched as one pattern it backtracked cubically (17 s on 4 KiB of
    `<meta<meta…<meta charset=` and spaces). Each tag (up to its `>`) is read once, its
    `charset` words right to left; a later `<meta` inside the same tag would only see fewer.
    """
    lowered = head.lower()  # ASCII only, as re.IGNORECASE is for bytes
    start = lowered.find(b"<meta")
    while start != -1:
        end = lowered.find(b">", start)
        end = len(head) if end == -1 else end
        at = lowered.rfind(b"charset", start + 6, end)
        while at != -1:
            if match := _CHARSET_DECLARATION.match(head, at):
                return match.group(1)
            at = lowered.rfind(b"charset", start + 6, at + 6)
        start = lowered.find(b"<meta", end)
    return None


def _drop_boilerplate(soup: BeautifulSoup) -> None:
    for tag in soup.select(_DROPPED):
        # Select returns parents before children; a child of a dropped tag is gone already.
        if not tag.decomposed and not _kept_semantic(tag):
            tag.decompose()
    for tag in soup.find_all(_hidden):
        if not tag.decomposed:  # hidden inside a hidden parent: gone with it
            tag.decompose()
    for tag in soup.find_all(_permalink):
        tag.decompose()
    for br in soup.find_all("br"):
        br.replace_with("\n")


def _kept_semantic(tag: Tag) -> bool:
    """A <header> inside <article> or <main> holds the article's own heading; an <aside> that
    is a footnote (Sphinx's `aside.footnote`, an EPUB's `epub:type="footnote"`) is the text's."""
    if tag.name == "header":
        return tag.find_parent(["article", "main"]) is not None
    if tag.name != "aside":
        return False
    kinds = " ".join(str(tag.get(a, "")) for a in ("class", "role", "epub:type")).casefold()
    return any(kind in kinds for kind in _NOTES)


def _hidden(tag: Tag) -> bool:
    """An element a browser does not show: its text is not the page's content, and hidden
    text is where a page hides instructions for a model that reads it."""
    if tag.has_attr("hidden") or str(tag.get("aria-hidden", "")).lower() == "true":
        return True
    style = _HIDDEN_STYLE_SPACE.sub("", str(tag.get("style", ""))).lower()
    return _HIDDEN_STYLE.search(style) is not None


def _permalink(tag: Tag) -> bool:
    """An anchor that links its heading (or term) to itself: Sphinx's `a.headerlink`, or a
    link to `#…` on the same page whose text is only a sign. It would end every heading, and
    every chunk's heading path, in "¶"."""
    if tag.name != "a":
        return False
    if "headerlink" in (tag.get("class") or []):
        return True
    text = tag.get_text().strip()
    return (
        str(tag.get("href", "")).startswith("#")
        and 0 < len(text) <= _PERMALINK_LENGTH
        and all(c in _PERMALINK_SIGNS or unicodedata.category(c) == "Co" for c in text)
    )


def _content_root(soup: BeautifulSoup) -> Tag:
    articles = soup.find_all("article")
    candidates = (soup.find("main"), articles[0] if len(articles) == 1 else None, soup.body)
    return next((tag for tag in candidates if isinstance(tag, Tag)), soup)


def _html_title(soup: BeautifulSoup) -> str | None:
    for tag in (soup.title, soup.find("h1")):
        if isinstance(tag, Tag) and (title := clean_title(tag.get_text())):
            return title
    return None


def _html_blocks(node: Tag) -> Iterator[Block]:
    """Yield the Markdown blocks under `node`; each run of inline content is one paragraph.

    Plain containers (`div`, `section`, …) are walked with a stack of their own, not by
    recursion: pages nest them hundreds deep, more than Python's recursion allows."""
    run: list[str] = []
    stack = [(node, iter(node.children))]
    while stack:
        container, children = stack[-1]
        child = next(children, None)
        if child is None:  # the end of a container: its inline run is a paragraph
            stack.pop()
            yield from _blocks(_running(run), container)
            run = []
        elif isinstance(child, Tag) and child.name not in _INLINE_TAGS:
            yield from _blocks(_running(run), container)
            run = []
            if _is_container(child):
                stack.append((child, iter(child.children)))
            else:
                yield from _blocks(_html_block(child), child, structural=True)
        else:
            run.append(_inline_text(child))


def _blocks(texts: Iterable[str], source: Tag, *, structural: bool = False) -> Iterator[Block]:
    return (Block(text, source, structural) for text in texts)


def _is_container(tag: Tag) -> bool:
    return (
        tag.name not in _UNRENDERED_TAGS
        and tag.name not in _HEADING_LEVELS
        and tag.name not in ("li", "dt", "dd", "tr", "pre")
    )


def _html_block(tag: Tag) -> Iterator[str]:
    """A block that is not a plain container (see `_is_container`)."""
    level = _HEADING_LEVELS.get(tag.name)
    if tag.name in _UNRENDERED_TAGS:
        return
    if level is not None:
        yield from _prefixed("#" * level + " ", list(_paragraph([tag.get_text()])))
    elif tag.name == "li":
        yield from _listed([block.text for block in _html_blocks(tag)])
    elif tag.name in ("dt", "dd"):  # a term and its definition: kept beside each other
        yield from (block.text for block in _html_blocks(tag))
    elif tag.name == "tr":
        cells = (collapse(cell.get_text()) for cell in tag.find_all(["td", "th"]))
        yield from _running([" | ".join(cell for cell in cells if cell)])
    elif tag.name == "pre":
        # Code keeps its lines; the fence stops `# comments` from reading as headings.
        code = tag.get_text().strip("\n")
        if code.strip():
            yield f"```\n{code}\n```"


def _inline_text(node: PageElement) -> str:
    if isinstance(node, Tag):
        return node.get_text()
    if isinstance(node, NavigableString) and not isinstance(node, PreformattedString):
        return str(node)
    return ""  # comments, doctype, CDATA


def _paragraph(run: Sequence[str]) -> Iterator[str]:
    # A soft hyphen marks where a word may break ("Fig\u00adure"); a browser shows none.
    text = collapse("".join(run).replace("\u00ad", ""))
    if text:
        yield text


def _running(run: Sequence[str]) -> Iterator[str]:
    """A paragraph of running text (or a table row), escaped where it would start a Markdown
    heading or code fence ("#include <stdio.h>" in prose)."""
    for text in _paragraph(run):
        yield "\\" + text if _MARKDOWN_START.match(text) else text


def _prefixed(prefix: str, blocks: Sequence[str]) -> Iterator[str]:
    if blocks:
        yield prefix + blocks[0]
        yield from blocks[1:]


def _listed(blocks: Sequence[str]) -> Iterator[str]:
    """A list item's blocks, the first one after "- " unless it is a heading or code: the
    bullet would hide those from a Markdown reader (Javadoc puts each section in an item)."""
    if blocks and _MARKDOWN_START.match(blocks[0]):
        yield from blocks
    else:
        yield from _prefixed("- ", blocks)
