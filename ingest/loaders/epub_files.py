"""EPUB: the book's chapters in reading (spine) order, each rendered as the HTML loader renders
a page, as one Markdown text titled from the book's Dublin Core metadata.

An EPUB is a zip archive of XHTML chapters, checked against zip bombs before anything in it is
read. The package is read as a tolerant reader reads it, not as a validator does: a library
that reads every file the manifest names, by the name as written, refuses real books whole
(SiSU names `chapter.xhtml#o8` in its manifest and spine; ConTeXt names images it never put in
the archive; Publican stores UTF-8 names without the zip flag that says so). So only the files
the spine names are read, each once; an href loses its `#fragment`, is percent-decoded and
resolved against the package document's folder, and a name is found as stored, as UTF-8, or
regardless of case; a spine file that is not in the archive is skipped. Without
`META-INF/container.xml`, the archive's one package document (`.opf`) is the book's.

A chapter is rendered whole (no main-content selection: a chapter has no site navigation
around it, and trafilatura drops short passages such as epigraphs and verse). A chapter that
has no heading of its own (many books title their chapters only in the table of contents)
opens with `# <its table-of-contents title>`, so the chunker still knows which chapter a
passage is in; the titles come from the navigation document (EPUB 3), else the NCX (EPUB 2).
The navigation document itself, the cover page and anything else without text add nothing.
"""

from __future__ import annotations

import logging
import posixpath
import re
import urllib.parse
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import lxml.etree
import lxml.html

from ingest.loaders.archives import open_archive
from ingest.loaders.cleaning import clean_text, clean_title, collapse
from ingest.loaders.html_files import html_text
from ingest.loaders.parsing import Parsed, ParseError, bad_content
from ragservice.limits.documents import DocumentLimits

log = logging.getLogger(__name__)

_CONTAINER = "META-INF/container.xml"
_PACKAGE_TYPE = "application/oebps-package+xml"
_CHAPTER_TYPES = frozenset({"application/xhtml+xml", "text/html"})
_CHAPTER_SUFFIXES = (".xhtml", ".html", ".htm")
_HEADING = re.compile(r"^#{1,6} ", re.M)
_UTF8_NAMES = 0x800  # the zip flag that says a member's name is UTF-8


def parse_epub(data: bytes, limits: DocumentLimits) -> Parsed:
    with bad_content("not a valid EPUB file"), open_archive(data, "EPUB") as archive:
        members = _Members(archive)
        package = _package(members)
        chapters = list(_chapters(members, package, _toc_titles(members, package), limits))
    metadata: dict[str, Any] = {"chapters": len(chapters)}
    if package.authors:
        metadata["author"] = "; ".join(package.authors)
    if package.language:
        metadata["language"] = package.language
    return Parsed(clean_text("\n\n".join(chapters)), package.title, "markdown", metadata)


# -- the archive -------------------------------------------------------------------------------


class _Members:
    """The archive's members by name, found as a tolerant reader finds them."""

    def __init__(self, archive: zipfile.ZipFile) -> None:
        self._archive = archive
        self._names: dict[str, zipfile.ZipInfo] = {}
        self._folded: dict[str, zipfile.ZipInfo] = {}
        for info in archive.infolist():
            for name in (info.filename, _utf8_name(info)):
                self._names.setdefault(name, info)
                self._folded.setdefault(name.casefold(), info)

    def find(self, name: str) -> zipfile.ZipInfo | None:
        return self._names.get(name) or self._folded.get(name.casefold())

    def read(self, name: str) -> bytes | None:
        info = self.find(name)
        return None if info is None else self._archive.read(info)

    def packages(self) -> set[str]:
        """The names of the package documents (`.opf`) in the archive."""
        infos = self._archive.infolist()
        return {i.filename for i in infos if i.filename.casefold().endswith(".opf")}


def _utf8_name(info: zipfile.ZipInfo) -> str:
    """The member's name as UTF-8 where the zip says cp437 (zipfile's reading of a name stored
    without the UTF-8 flag) but the bytes are UTF-8, as most tools write them."""
    if info.flag_bits & _UTF8_NAMES:
        return info.filename
    try:
        return info.filename.encode("cp437").decode("utf-8")
    except UnicodeError:
        return info.filename


def _resolve(folder: str, href: str) -> list[str]:
    """The archive names an href may mean, most likely first: decoded, then as written."""
    try:
        path = urllib.parse.urlsplit(href.strip().replace("\\", "/"))
    except ValueError:  # "//[": no name in the archive
        return []
    if path.scheme or path.netloc or not path.path:
        return []  # a link out of the book, or to a place in the same file
    names = [urllib.parse.unquote(path.path), path.path]
    return list(dict.fromkeys(_join(folder, name) for name in names))


def _join(folder: str, name: str) -> str:
    joined = name.lstrip("/") if name.startswith("/") else posixpath.join(folder, name)
    return posixpath.normpath(joined).lstrip("/")


def _locate(members: _Members, folder: str, href: str) -> str | None:
    """The member an href names, by its name in the archive; None when it is not there."""
    for name in _resolve(folder, href):
        info = members.find(name)
        if info is not None:
            return info.filename
    return None


# -- the package document ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Item:
    href: str
    media_type: str
    properties: frozenset[str]


@dataclass
class _Package:
    path: str
    title: str | None = None
    authors: list[str] = field(default_factory=list)
    language: str | None = None
    items: dict[str, _Item] = field(default_factory=dict)
    spine: list[str] = field(default_factory=list)
    ncx: str = ""

    @property
    def folder(self) -> str:
        return posixpath.dirname(self.path)


def _package(members: _Members) -> _Package:
    path = _package_path(members)
    root = _xml(members.read(path) or b"")
    if root is None:
        raise ParseError(f"not a valid EPUB file: {path!r} is not XML")
    package = _Package(path)
    for element in root.iter():
        _read_element(package, element)
    if not package.spine:
        raise ParseError("not a valid EPUB file: the package document has no spine")
    return package


def _package_path(members: _Members) -> str:
    """The package document the container names, else the archive's only one."""
    container = _xml(members.read(_CONTAINER) or b"")
    rootfiles = [] if container is None else _elements(container, "rootfile")
    rootfiles.sort(key=lambda e: e.get("media-type") != _PACKAGE_TYPE)
    for rootfile in rootfiles:
        found = _locate(members, "", rootfile.get("full-path", ""))
        if found:
            return found
    packages = members.packages()
    if len(packages) == 1:
        return packages.pop()
    raise ParseError("not a valid EPUB file: no package document (META-INF/container.xml)")


def _read_element(package: _Package, element: Any) -> None:
    name = _local(element)
    if name == "item" and element.get("id") is not None:
        package.items[element.get("id")] = _Item(
            element.get("href", ""),
            element.get("media-type", "").strip().lower(),
            frozenset(element.get("properties", "").split()),
        )
    elif name == "itemref" and element.get("idref"):
        package.spine.append(element.get("idref"))
    elif name == "spine":
        package.ncx = element.get("toc", "")
    elif name == "title" and package.title is None:
        package.title = clean_title(element.text)
    elif name == "creator" and (author := clean_title(element.text)):
        package.authors.append(author)
    elif name == "language" and package.language is None:
        package.language = clean_title(element.text)


def _xml(data: bytes) -> Any:
    """The XML's root element, None for none. XML as data: no entity expanded, no network;
    a damaged document is read as far as it goes (a parser per call: they are not shared
    between threads)."""
    if not data.strip():
        return None
    parser = lxml.etree.XMLParser(resolve_entities=False, no_network=True, recover=True)
    return lxml.etree.fromstring(data, parser)


def _local(element: Any) -> str:
    return lxml.etree.QName(element).localname if isinstance(element.tag, str) else ""


def _elements(root: Any, name: str) -> list[Any]:
    return [element for element in root.iter() if _local(element) == name]


# -- the chapters ------------------------------------------------------------------------------


def _chapters(
    members: _Members, package: _Package, titles: dict[str, str], limits: DocumentLimits
) -> Iterator[str]:
    """Each chapter's Markdown in spine order; ParseError as soon as the book's text is over
    the character limit (a book is read whole before the limit is checked otherwise)."""
    total = 0
    for path in _spine_paths(members, package):
        text, _title = html_text(members.read(path) or b"", main_content=False)
        text = clean_text(text)
        if not text:
            continue
        heading = titles.get(path)
        if heading and not _HEADING.search(text):
            text = f"# {heading}\n\n{text}"
        total += len(text) + 2
        if total > limits.max_chars:
            raise ParseError(
                f"the text is over {limits.max_chars} characters (RAGSERVICE_MAX_DOCUMENT_CHARS)"
            )
        yield text


def _spine_paths(members: _Members, package: _Package) -> list[str]:
    """The archive names of the spine's documents, in order, each once (SiSU's spine names a
    file once per section, as `file.xhtml#o8`), the navigation document left out."""
    paths: dict[str, None] = {}  # ordered, each once
    named = 0
    for idref in package.spine:
        item = package.items.get(idref)
        if item is None or "nav" in item.properties or not _chapter(item):
            continue
        named += 1
        path = _locate(members, package.folder, item.href)
        if path is None:
            log.info("the spine's %r is not in the archive; skipped", item.href[:200])
        else:
            paths.setdefault(path)
    if named and not paths:
        raise ParseError("not a valid EPUB file: none of the spine's documents is in the archive")
    return list(paths)


def _chapter(item: _Item) -> bool:
    if item.media_type in _CHAPTER_TYPES:
        return True
    # A chapter declared with a wrong type ("text/xml", none) is still a chapter.
    href = urllib.parse.urlsplit(item.href).path.casefold()
    return not item.media_type.startswith("image/") and href.endswith(_CHAPTER_SUFFIXES)


# -- the table of contents ---------------------------------------------------------------------


def _toc_titles(members: _Members, package: _Package) -> dict[str, str]:
    """The first table-of-contents title of each file the table links to, by archive name:
    the navigation document's (EPUB 3), else the NCX's (EPUB 2). A table that cannot be read
    gives no titles; the chapters are still read."""
    nav = next((i for i in package.items.values() if "nav" in i.properties), None)
    ncx = package.items.get(package.ncx) or next(
        (i for i in package.items.values() if i.media_type == "application/x-dtbncx+xml"), None
    )
    for item, read in ((nav, _nav_links), (ncx, _ncx_links)):
        path = None if item is None else _locate(members, package.folder, item.href)
        if path is None:
            continue
        try:
            links = read(members.read(path) or b"")
        except (lxml.etree.LxmlError, ValueError):
            log.info("the table of contents %r cannot be read", path[:200], exc_info=True)
            continue
        if titles := _titles(members, posixpath.dirname(path), links):
            return titles
    return {}


def _titles(members: _Members, folder: str, links: list[tuple[str, str]]) -> dict[str, str]:
    titles: dict[str, str] = {}
    for href, title in links:
        target = _locate(members, folder, href)
        heading = collapse(clean_text(title))
        if target and heading:
            titles.setdefault(target, heading)
    return titles


def _nav_links(data: bytes) -> list[tuple[str, str]]:
    """(href, title) of each link of the navigation document's table of contents."""
    root = lxml.html.fromstring(data) if data.strip() else None
    if root is None:
        return []
    navs = [e for e in root.iter() if _local(e) == "nav"]
    toc = next((n for n in navs if "toc" in _epub_type(n).split()), navs[0] if navs else root)
    return [(a.get("href", ""), a.text_content()) for a in toc.iter() if _local(a) == "a"]


def _epub_type(element: Any) -> str:
    return next((v for k, v in element.attrib.items() if str(k).endswith("type")), "")


def _ncx_links(data: bytes) -> list[tuple[str, str]]:
    """(src, label) of each navPoint of an NCX, in document order."""
    root = _xml(data)
    links: list[tuple[str, str]] = []
    for point in [] if root is None else _elements(root, "navPoint"):
        label = next((e for e in point if _local(e) == "navLabel"), None)
        content = next((e for e in point if _local(e) == "content"), None)
        if label is not None and content is not None:
            texts = [e.text or "" for e in label.iter() if _local(e) == "text"]
            links.append((content.get("src", ""), " ".join(texts)))
    return links
