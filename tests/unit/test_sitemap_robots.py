"""A crawl's first requests against a loopback site that records what it is asked: a sitemap
index of 100,000 sitemaps is merged in linear time, and robots.txt is obeyed for the start
page and the sitemaps as for every other page."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ingest.sources.base import Changed, SourceError
from ingest.sources.web import MAX_SITEMAPS, WebReader


@dataclass
class Site:
    """What the server answers (path → body and type; anything else is a 404) and the paths
    it was asked for, in order."""

    files: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        site: Site = self.server.site  # type: ignore[attr-defined]
        with site.lock:
            site.asked.append(self.path)
        body, kind = site.files.get(self.path, (b"not found", "text/plain"))
        self.send_response(200 if self.path in site.files else 404)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def site() -> Iterator[tuple[Site, str]]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    served = Site()
    httpd.site = served  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield served, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def _reader(base: str) -> WebReader:
    return WebReader(f"{base}/", rate=1e6, allow_private=True, timeout=10.0)


def _html(text: str) -> tuple[bytes, str]:
    return f"<html><body><p>{text}</p></body></html>".encode(), "text/html"


def _xml(kind: str, urls: list[str]) -> tuple[bytes, str]:
    tag = "sitemap" if kind == "sitemapindex" else "url"
    items = "".join(f"<{tag}><loc>{url}</loc></{tag}>" for url in urls)
    return f'<?xml version="1.0"?><{kind}>{items}</{kind}>'.encode(), "application/xml"


def test_a_sitemap_index_of_100k_sitemaps_is_merged_in_linear_time(
    site: tuple[Site, str],
) -> None:
    served, base = site
    children = [f"{base}/maps/{i}.xml" for i in range(100_000)]
    served.files = {
        "/": _html("start"),
        "/sitemap.xml": _xml("sitemapindex", children),
        **{f"/maps/{i}.xml": _xml("urlset", [f"{base}/p{i}.html"]) for i in range(10)},
        **{f"/p{i}.html": _html(f"page {i}") for i in range(10)},
    }
    started = time.process_time()
    events = list(_reader(base).scan({}))
    spent = time.process_time() - started

    # Merging was quadratic in the children (about 69 s of CPU for these); linear, it is well
    # under a second, and the bound stays far from both on a busy machine.
    assert spent < 10.0, f"{spent:.1f} s of CPU"
    maps = [path for path in served.asked if path.startswith("/maps/")]
    assert len(maps) == MAX_SITEMAPS - 1  # the index is one of the sitemaps read
    assert len(set(maps)) == len(maps)
    assert {e.key for e in events if isinstance(e, Changed)} == {
        f"{base}/",
        *(f"{base}/p{i}.html" for i in range(10)),
    }


def test_a_sitemap_listed_twice_or_in_a_loop_is_read_once(site: tuple[Site, str]) -> None:
    served, base = site
    index = _xml("sitemapindex", [f"{base}/a.xml", f"{base}/sitemap.xml", f"{base}/a.xml"])
    served.files = {
        "/": _html("start"),
        "/sitemap.xml": index,
        "/a.xml": _xml("sitemapindex", [f"{base}/sitemap.xml", f"{base}/b.xml"]),
        "/b.xml": _xml("urlset", [f"{base}/p.html"]),
        "/p.html": _html("p"),
    }
    list(_reader(base).scan({}))
    assert [p for p in served.asked if p.endswith(".xml")] == ["/sitemap.xml", "/a.xml", "/b.xml"]


def test_robots_disallowing_everything_stops_the_crawl_before_the_start_page(
    site: tuple[Site, str],
) -> None:
    served, base = site
    served.files = {
        "/robots.txt": (b"User-agent: *\nDisallow: /\n", "text/plain"),
        "/": _html("start"),
        "/sitemap.xml": _xml("urlset", [f"{base}/p.html"]),
        "/p.html": _html("p"),
    }
    with pytest.raises(SourceError, match=r"robots\.txt disallows the start page"):
        list(_reader(base).scan({}))
    assert served.asked == ["/robots.txt"]


def test_a_sitemap_robots_disallows_is_not_fetched(site: tuple[Site, str]) -> None:
    served, base = site
    served.files = {
        "/robots.txt": (b"User-agent: *\nDisallow: /sitemap.xml\n", "text/plain"),
        "/": _html('start <a href="/p.html">p</a>'),
        "/sitemap.xml": _xml("urlset", [f"{base}/q.html"]),
        "/p.html": _html("p"),
        "/q.html": _html("q"),
    }
    events = list(_reader(base).scan({}))
    assert "/sitemap.xml" not in served.asked
    assert served.asked == ["/robots.txt", "/", "/p.html"]
    assert {e.key for e in events} == {f"{base}/", f"{base}/p.html"}
