"""A crawl's first requests against a loopback site that records what it is asked: a sitemap
index of 100,000 sitemaps is merged in linear time, and robots.txt is obeyed for the start
page and the sitemaps as for every other page."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from ingest.sources.base import Changed, SourceError
from ingest.sources.web import MAX_SITEMAPS, WebReader
from tests.slow_site import SlowSite, slow_site


@pytest.fixture
def site() -> Iterator[tuple[SlowSite, str]]:
    with slow_site() as served:
        yield served


def _reader(base: str) -> WebReader:
    return WebReader(f"{base}/", rate=1e6, allow_private=True, timeout=10.0)


def _html(text: str) -> tuple[bytes, str]:
    return f"<html><body><p>{text}</p></body></html>".encode(), "text/html"


def _xml(kind: str, urls: list[str]) -> tuple[bytes, str]:
    tag = "sitemap" if kind == "sitemapindex" else "url"
    items = "".join(f"<{tag}><loc>{url}</loc></{tag}>" for url in urls)
    return f'<?xml version="1.0"?><{kind}>{items}</{kind}>'.encode(), "application/xml"


def test_a_sitemap_index_of_100k_sitemaps_is_merged_in_linear_time(
    site: tuple[SlowSite, str],
) -> None:
    served, base = site
    children = [f"{base}/maps/{i}.xml" for i in range(100_000)]
    served.pages = {
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


def test_a_sitemap_listed_twice_or_in_a_loop_is_read_once(site: tuple[SlowSite, str]) -> None:
    served, base = site
    index = _xml("sitemapindex", [f"{base}/a.xml", f"{base}/sitemap.xml", f"{base}/a.xml"])
    served.pages = {
        "/": _html("start"),
        "/sitemap.xml": index,
        "/a.xml": _xml("sitemapindex", [f"{base}/sitemap.xml", f"{base}/b.xml"]),
        "/b.xml": _xml("urlset", [f"{base}/p.html"]),
        "/p.html": _html("p"),
    }
    list(_reader(base).scan({}))
    assert [p for p in served.asked if p.endswith(".xml")] == ["/sitemap.xml", "/a.xml", "/b.xml"]


def test_robots_disallowing_everything_stops_the_crawl_before_the_start_page(
    site: tuple[SlowSite, str],
) -> None:
    served, base = site
    served.pages = {
        "/robots.txt": (b"User-agent: *\nDisallow: /\n", "text/plain"),
        "/": _html("start"),
        "/sitemap.xml": _xml("urlset", [f"{base}/p.html"]),
        "/p.html": _html("p"),
    }
    with pytest.raises(SourceError, match=r"robots\.txt disallows the start page"):
        list(_reader(base).scan({}))
    assert served.asked == ["/robots.txt"]


def test_a_sitemap_robots_disallows_is_not_fetched(site: tuple[SlowSite, str]) -> None:
    served, base = site
    served.pages = {
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
