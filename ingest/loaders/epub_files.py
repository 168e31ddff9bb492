"""EPUB: the book's chapters in reading (spine) order, each rendered as the HTML loader renders
a page, as one Markdown text titled from the book's Dublin Core metadata.

An EPUB is a zip archive of XHTML chapters; it is checked against zip bombs before ebooklib,
which reads every member into memory, opens it. A chapter is rendered whole (no main-content
selection: a chapter has no site navigation around it, and trafilatura drops short passages
such as epigraphs and verse). A chapter that has no heading of its own (many books title their
chapters only in the table of contents) opens with `# <its table-of-contents title>`, so the
chunker still knows which chapter a passage is in. The navigation document, the cover page and
anything else without text add nothing.
"""

from __future__ import annotations

import io
import posixpath
import re
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import ebooklib
from ebooklib import epub

from ingest.loaders.archives import open_archive
from ingest.loaders.cleaning import clean_text, clean_title, collapse
from ingest.loaders.html_files import html_text
from ingest.loaders.parsing import Parsed, ParseError, bad_content
from ragservice.limits.documents import DocumentLimits

_CHAPTER_TYPES = frozenset({"application/xhtml+xml", "text/html"})
_HEADING = re.compile(r"^#{1,6} ", re.M)


def parse_epub(data: bytes, limits: DocumentLimits) -> Parsed:
    # ebooklib warns of its own future defaults, BeautifulSoup of XHTML read as HTML (meant:
    # lxml's HTML parser forgives what real books get wrong).
    with bad_content("not a valid EPUB file"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        open_archive(data, "EPUB").close()
        book = epub.read_epub(io.BytesIO(data), {"ignore_ncx": True})
        titles = _toc_titles(book.toc)
        chapters = list(_chapters(book, titles, limits))
        title = clean_title(book.title)
        metadata = _book_metadata(book, len(chapters))
    return Parsed(clean_text("\n\n".join(chapters)), title, "markdown", metadata)


def _chapters(book: Any, titles: dict[str, str], limits: DocumentLimits) -> Iterator[str]:
    """Each chapter's Markdown in spine order; ParseError as soon as the book's text is over
    the character limit (a book is read whole before the limit is checked otherwise)."""
    total = 0
    for item in _spine_items(book):
        content = item.content or b""
        markup = content if isinstance(content, bytes) else str(content).encode("utf-8")
        text, _title = html_text(markup, main_content=False)
        text = clean_text(text)
        if not text:
            continue
        heading = titles.get(_normalized(str(item.file_name)))
        if heading and not _HEADING.search(text):
            text = f"# {heading}\n\n{text}"
        total += len(text) + 2
        if total > limits.max_chars:
            raise ParseError(
                f"the text is over {limits.max_chars} characters (RAGSERVICE_MAX_DOCUMENT_CHARS)"
            )
        yield text


def _spine_items(book: Any) -> Iterator[Any]:
    """The spine's XHTML items, in order, each once, without the navigation document."""
    items = {item.id: item for item in book.get_items()}  # a lookup by id scans them all
    seen: set[str] = set()
    for entry in book.spine:
        idref = entry[0] if isinstance(entry, tuple) else entry
        item = items.get(idref)
        if item is None or idref in seen or item.get_type() == ebooklib.ITEM_NAVIGATION:
            continue
        seen.add(idref)
        if item.media_type in _CHAPTER_TYPES:
            yield item


def _toc_titles(toc: Iterable[Any]) -> dict[str, str]:
    """The first table-of-contents title of each file the table links to (by file name
    relative to the package document, without the `#fragment`)."""
    titles: dict[str, str] = {}
    stack = list(reversed(list(toc)))
    while stack:
        entry = stack.pop()
        if isinstance(entry, tuple | list):
            stack.extend(reversed(list(entry)))  # (Section, [children])
            continue
        href, title = getattr(entry, "href", ""), getattr(entry, "title", "")
        name = _normalized(str(href or "").partition("#")[0])
        heading = collapse(clean_text(str(title or "")))
        if name and heading:
            titles.setdefault(name, heading)
    return titles


def _normalized(href: str) -> str:
    return posixpath.normpath(href) if href else ""


def _book_metadata(book: Any, chapters: int) -> dict[str, Any]:
    metadata: dict[str, Any] = {"chapters": chapters}
    authors = [a for value, _ in book.get_metadata("DC", "creator") if (a := clean_title(value))]
    if authors:
        metadata["author"] = "; ".join(authors)
    languages = [value for value, _ in book.get_metadata("DC", "language") if clean_title(value)]
    if languages:
        metadata["language"] = clean_title(languages[0])
    return metadata
