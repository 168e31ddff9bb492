"""The web source against a generated site served on localhost: first crawl, conditional
re-crawl, changes and removals, robots.txt, sitemaps (gzip, index), the guard and the caps."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ingest.sources.base import (
    Changed,
    Failed,
    ItemState,
    ScanEvent,
    Skipped,
    SourceError,
    Unchanged,
)
from ingest.sources.web import WebReader, _Pacer

SECTIONS = 10
PAGES = 189  # + the index and 10 sections: 200 documents


@dataclass
class Served:
    """The site the server serves, and what it was asked."""

    pages: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    other: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    robots: str = ""
    redirects: dict[str, str] = field(default_factory=dict)
    log: list[tuple[str, str | None, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def page_requests(self) -> list[tuple[str, str | None, int]]:
        return [entry for entry in self.log if entry[0].startswith("/docs/")]


def _html(title: str, links: list[str]) -> bytes:
    anchors = "".join(f'<a href="{link}">{link}</a>' for link in links)
    head = f"<head><title>{title}</title></head>"
    return f"<html>{head}<body><h1>{title}</h1>{anchors}</body></html>".encode()


def _site(served: Served, *, sitemap: bool, base: str) -> None:
    sections = [f"s{k}.html" for k in range(SECTIONS)]
    index_links = [
        *sections,
        "private/secret.html",  # robots.txt disallows it
        "/other/outside.html",  # not under /docs/
        "http://elsewhere.invalid/x.html",  # another host
        "#top",
        "s0.html#part",  # the same page as s0.html
    ]
    served.pages = {"/docs/": (_html("Index", [] if sitemap else index_links), "text/html")}
    for k in range(SECTIONS):
        children = [f"p{i:03}.html" for i in range(PAGES) if i % SECTIONS == k]
        served.pages[f"/docs/s{k}.html"] = (
            _html(f"S{k}", [] if sitemap else children),
            "text/html",
        )
    for i in range(PAGES):
        served.pages[f"/docs/p{i:03}.html"] = (_html(f"Page {i}", ["s0.html"]), "text/html")
    served.pages["/docs/private/secret.html"] = (b"secret", "text/plain")
    served.robots = "User-agent: *\nDisallow: /docs/private/\n"
    served.other = {}
    served.redirects = {}
    if sitemap:
        served.robots += f"Sitemap: {base}/sitemap_index.xml.gz\n"
        urls = [f"{base}{path}" for path in served.pages] + ["http://elsewhere.invalid/x.html"]
        half = len(urls) // 2
        served.other = {
            "/sitemap_index.xml.gz": (
                gzip.compress(_sitemap("sitemapindex", [f"{base}/sm1.xml", f"{base}/sm2.xml.gz"])),
                "application/gzip",
            ),
            "/sm1.xml": (_sitemap("urlset", urls[:half]), "application/xml"),
            "/sm2.xml.gz": (gzip.compress(_sitemap("urlset", urls[half:])), "application/gzip"),
        }


def _sitemap(kind: str, urls: list[str]) -> bytes:
    tag = "sitemap" if kind == "sitemapindex" else "url"
    items = "".join(f"<{tag}><loc>{url}</loc></{tag}>" for url in urls)
    return f'<?xml version="1.0"?><{kind} xmlns="x">{items}</{kind}>'.encode()


def _etag(body: bytes) -> str:
    return f'"{abs(hash(body)):x}"'


LAST_MODIFIED = formatdate(1_700_000_000, usegmt=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body in separate writes: no 40 ms stalls

    def do_GET(self) -> None:
        served: Served = self.server.served  # type: ignore[attr-defined]
        path = self.path
        if path == "/robots.txt":
            self._send(200, served.robots.encode(), "text/plain")
            return
        if path in served.redirects:
            self.send_response(302)
            self.send_header("Location", served.redirects[path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if path in served.other:
            self._send(200, *served.other[path])
            return
        found = served.pages.get(path)
        if found is None:
            self._log(None, 404)
            self._send(404, b"not found", "text/plain")
            return
        body, content_type = found
        etag = _etag(body)
        asked = self.headers.get("If-None-Match")
        if asked == etag:
            self._log(asked, 304)
            self._send(304, b"", content_type, etag)
            return
        self._log(asked, 200)
        self._send(200, body, content_type, etag)

    def _log(self, asked: str | None, status: int) -> None:
        served: Served = self.server.served  # type: ignore[attr-defined]
        with served.lock:
            served.log.append((self.path, asked, status))

    def _send(self, status: int, body: bytes, content_type: str, etag: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if etag:
            self.send_header("ETag", etag)
            self.send_header("Last-Modified", LAST_MODIFIED)
        if status != 304:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if status != 304:
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[Served, str]]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    served = Served()
    httpd.served = served  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield served, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def _reader(base: str, **options: object) -> WebReader:
    settings: dict[str, object] = {"rate": 1000.0, "allow_private": True, "timeout": 5.0}
    settings.update(options)
    return WebReader(f"{base}/docs/", **settings)  # type: ignore[arg-type]


def _states(events: list[ScanEvent]) -> dict[str, ItemState]:
    return {e.key: e.state for e in events if isinstance(e, Changed | Unchanged)}


@pytest.mark.parametrize("sitemap", [False, True], ids=["links", "sitemap"])
def test_crawl_recrawl_and_changes(server: tuple[Served, str], sitemap: bool) -> None:
    served, base = server
    _site(served, sitemap=sitemap, base=base)
    reader = _reader(base)
    first = list(reader.scan({}))
    assert [type(e) for e in first] == [Changed] * 200
    assert reader.complete and reader.stats.from_sitemap is sitemap
    assert f"{base}/docs/private/secret.html" not in {e.key for e in first}
    assert all(path != "/docs/private/secret.html" for path, _, _ in served.log)
    page = next(e for e in first if isinstance(e, Changed) and e.key.endswith("p007.html"))
    assert page.name == "p007.html" and page.data == served.pages["/docs/p007.html"][0]
    assert page.origin["etag"] == _etag(page.data)
    assert page.origin["content_type"] == "text/html"
    assert page.state.last_modified == LAST_MODIFIED
    index = next(e for e in first if e.key == f"{base}/docs/")
    assert isinstance(index, Changed) and index.name == "index.html"

    known = _states(first)
    served.log.clear()
    again = _reader(base)
    second = list(again.scan(known))
    assert [type(e) for e in second] == [Unchanged] * 200
    pages = served.page_requests()
    assert len(pages) == 200
    assert all(asked is not None and status == 304 for _, asked, status in pages)
    assert again.stats.not_modified == 200 and again.complete

    changed = [f"/docs/p{i:03}.html" for i in (3, 50, 77, 120, 188)]
    for path in changed:
        served.pages[path] = (_html(f"{path} new", ["s0.html"]), "text/html")
    removed = [f"/docs/p{i:03}.html" for i in (4, 51, 99)]
    for path in removed:
        del served.pages[path]
    third = list(_reader(base).scan(known))
    assert sorted(e.key for e in third if isinstance(e, Changed)) == [base + p for p in changed]
    assert sum(isinstance(e, Unchanged) for e in third) == 192
    assert set(known) - {e.key for e in third} == {base + p for p in removed}


def test_a_body_the_same_without_validators_is_unchanged(server: tuple[Served, str]) -> None:
    served, base = server
    _site(served, sitemap=False, base=base)
    first = list(_reader(base, depth=0).scan({}))
    assert len(first) == 1 and isinstance(first[0], Changed)
    stale = {first[0].key: ItemState(content_hash=first[0].state.content_hash)}
    again = list(_reader(base, depth=0).scan(stale))
    assert [type(e) for e in again] == [Unchanged]


def test_depth_and_the_page_cap(server: tuple[Served, str]) -> None:
    served, base = server
    _site(served, sitemap=False, base=base)
    shallow = _reader(base, depth=1)
    assert len(list(shallow.scan({}))) == 1 + SECTIONS and shallow.complete
    capped = _reader(base, max_pages=25)
    assert len(list(capped.scan({}))) == 25
    assert not capped.complete  # the sync must not delete what it did not reach


def test_failures_are_per_page(server: tuple[Served, str]) -> None:
    served, base = server
    _site(served, sitemap=False, base=base)
    served.pages["/docs/p005.html"] = (b"x" * 5000, "text/html")
    events = list(_reader(base, max_bytes=4000).scan({}))
    failed = [e for e in events if isinstance(e, Failed)]
    assert [e.key for e in failed] == [f"{base}/docs/p005.html"]
    assert "over the limit" in failed[0].reason


def test_a_page_of_a_type_no_loader_reads_is_skipped_and_said_so(
    server: tuple[Served, str],
) -> None:
    served, base = server
    _site(served, sitemap=False, base=base)
    served.pages["/docs/"] = (_html("Index", ["logo.gif", "s0.html"]), "text/html")
    served.pages["/docs/logo.gif"] = (b"GIF89a", "image/gif")
    reader = _reader(base, depth=1)
    events = list(reader.scan({}))
    skipped = [e for e in events if isinstance(e, Skipped)]
    assert skipped == [Skipped(f"{base}/docs/logo.gif", "unsupported content type image/gif")]
    assert [type(e) for e in events if e not in skipped] == [Changed, Changed]
    assert reader.stats.skipped == 1 and reader.complete


def test_the_start_url_failing_is_a_source_error(server: tuple[Served, str]) -> None:
    served, base = server
    _site(served, sitemap=False, base=base)
    with pytest.raises(SourceError, match="loopback address"):
        list(WebReader(f"{base}/docs/", rate=1000.0).scan({}))  # the guard, by default
    with pytest.raises(SourceError, match="HTTP 404"):
        list(_reader(base + "/nothing").scan({}))
    elsewhere = base.replace("127.0.0.1", "localhost") + "/docs/s1.html"  # another host
    served.redirects["/docs/"] = elsewhere
    with pytest.raises(SourceError, match=f"redirects to {elsewhere}, outside the site"):
        list(_reader(base).scan({}))
    served.redirects["/docs/"] = f"{base}/docs/s1.html"  # on the site: crawled from there
    assert len(list(_reader(base, depth=0).scan({}))) == 1
    del served.pages["/docs/"], served.redirects["/docs/"]
    with pytest.raises(SourceError, match="cannot be fetched"):
        list(_reader(base).scan({}))


def test_a_redirect_to_a_refused_address_fails_that_page(server: tuple[Served, str]) -> None:
    served, base = server
    _site(served, sitemap=False, base=base)
    port = base.rsplit(":", 1)[1]
    served.redirects = {"/docs/p001.html": f"http://127.0.0.2:{port}/docs/p001.html"}
    reader = _reader(base)
    reader.guard.policy = lambda address: "private" if str(address) == "127.0.0.2" else None
    reader.guard.allow_private = False
    events = list(reader.scan({}))
    failed = [e for e in events if isinstance(e, Failed)]
    assert len(failed) == 1 and "127.0.0.2, a private address" in failed[0].reason


def test_requests_are_paced_per_host_and_crawl_delay_slows_them(
    server: tuple[Served, str],
) -> None:
    served, base = server
    _site(served, sitemap=False, base=base)
    served.robots += "Crawl-delay: 3\n"
    waits: list[float] = []
    reader = _reader(base, depth=0, sleep=waits.append)
    assert len(list(reader.scan({}))) == 1
    # robots.txt, the start page and /sitemap.xml: the 2nd and 3rd wait for the delay (the
    # sleeps recorded here take no time, so the 3rd waits for both).
    assert reader.stats.requests == 3
    assert len(waits) == 2 and 2.5 < waits[0] <= 3.0 and 5.5 < waits[1] <= 6.0


def test_the_pacer_keeps_the_interval_per_host() -> None:
    now = [100.0]
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    pacer = _Pacer(0.5, clock=lambda: now[0], sleep=sleep)
    for url in ("http://a.test/1", "http://a.test/2", "http://b.test/1", "http://a.test/3"):
        pacer.wait(url)
    assert waits == [0.5, 0.5]


def test_a_known_page_robots_now_disallows_is_not_fetched_and_so_gone(
    server: tuple[Served, str],
) -> None:
    served, base = server
    _site(served, sitemap=False, base=base)
    secret = f"{base}/docs/private/secret.html"
    served.log.clear()
    reader = _reader(base, depth=1)
    events = list(reader.scan({secret: ItemState(etag='"old"')}))
    assert secret not in {e.key for e in events}
    assert reader.stats.disallowed == 1 and reader.complete
    assert all(path != "/docs/private/secret.html" for path, _, _ in served.log)
