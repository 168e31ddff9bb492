"""What a crawl reads off what it fetched: normalised URLs, a page's links, a sitemap's
locations, and the file name (its suffix picks the loader) a fetched document is parsed as."""

from __future__ import annotations

import html
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import PurePosixPath
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

from ingest.loaders.formats import SUFFIX_OF_MEDIA_TYPE, file_type

DEFAULT_PORTS = {"http": 80, "https": 443}

_HTML_TYPES = ("text/html", "application/xhtml+xml")
_LOC = re.compile(r"<(?:[\w.-]+:)?loc\s*>\s*([^<]*?)\s*</(?:[\w.-]+:)?loc\s*>", re.IGNORECASE)


def normalise(url: str) -> str | None:
    """`url` as one spelling: scheme and host in lower case, the default port and the
    fragment dropped, an empty path as `/`; None for what is not an http(s) URL."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port in (None, DEFAULT_PORTS[scheme]) else f"{host}:{port}"
    return urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))


@dataclass(frozen=True)
class Site:
    """The part of the web a crawl may visit: the start URL's scheme, host and port, and the
    paths under the start URL's folder."""

    start: str
    root: str
    prefix: str

    @classmethod
    def of(cls, start_url: str) -> Site:
        start = normalise(start_url)
        if start is None:
            raise ValueError(f"{start_url!r} is not an http or https URL")
        parts = urlsplit(start)
        folder = parts.path[: parts.path.rfind("/") + 1]
        return cls(start, f"{parts.scheme}://{parts.netloc}", folder)

    def holds(self, url: str) -> bool:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.netloc}" == self.root and parts.path.startswith(
            self.prefix
        )


class _LinkParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.hrefs: list[str] = []
        self.base: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if not href:
            return
        if tag == "base" and self.base is None:
            self.base = href
        elif tag in ("a", "area"):
            self.hrefs.append(href)


def page_links(
    body: bytes, url: str, content_type: str, wanted: Callable[[str], bool]
) -> tuple[str, ...]:
    """The links of an HTML page that `wanted` keeps, normalised, each once, in page order;
    () for anything that is not HTML."""
    if _media_type(content_type) not in _HTML_TYPES:
        return ()
    parser = _LinkParser()
    try:
        parser.feed(body.decode("utf-8", "replace"))
        parser.close()
    except AssertionError:  # html.parser gives up on some broken markup
        pass
    base = urljoin(url, parser.base) if parser.base else url
    found: dict[str, None] = {}
    for href in parser.hrefs:
        link = normalise(urljoin(base, href.strip()))
        if link is not None and wanted(link):
            found[link] = None
    return tuple(found)


def sitemap_locations(body: bytes, limit: int) -> tuple[list[str], list[str]]:
    """(the sitemaps a sitemap index lists, the pages a sitemap lists), normalised; a gzip
    body is unpacked up to `limit` bytes. Raises ValueError for what is no sitemap."""
    if body[:2] == b"\x1f\x8b":
        unpacker = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            body = unpacker.decompress(body, limit)
        except zlib.error as exc:
            raise ValueError(f"not a gzip file: {exc}") from exc
        if unpacker.unconsumed_tail:
            raise ValueError(f"the sitemap unpacks to more than {limit} bytes")
    # Read as text with a pattern rather than an XML parser: nothing in a sitemap needs
    # entities or DTDs, and a pattern cannot be made to expand them.
    text = body.decode("utf-8", "replace")
    if "<urlset" not in text and "<sitemapindex" not in text:
        raise ValueError("not a sitemap")
    found = [normalise(html.unescape(match)) for match in _LOC.findall(text)]
    locations = [url for url in found if url is not None]
    if "<sitemapindex" in text:
        return locations, []
    return [], locations


def document_name(url: str, content_type: str) -> str | None:
    """The file name a fetched document is parsed under: the URL path's last segment (or
    `index`) with the suffix of its media type, else of the path; None when no loader reads
    that suffix."""
    segment = unquote(urlsplit(url).path.rsplit("/", 1)[-1]) or "index"
    path = PurePosixPath(segment.replace("\\", "_"))
    suffix = SUFFIX_OF_MEDIA_TYPE.get(_media_type(content_type))
    name = (path.stem or "index") + suffix if suffix else path.name
    return name if file_type(name) else None


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()
