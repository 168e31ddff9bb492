"""A web site as a source: its sitemap's pages, or the pages linked from a start page.

The crawl asks each known page with `If-None-Match`/`If-Modified-Since` (a `304` is
unchanged, and its links, kept from the last run, lead the crawl on), obeys robots.txt for its
user agent (disallowed pages and sitemaps are not fetched, a disallowed start page stops the
run before any page is, `Crawl-delay` slows it), paces its requests per host,
and goes through the SSRF guard at every connection. It stays on the start URL's host and
below its folder. Fetching only: what the bodies say is the loaders' business.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any
from urllib.parse import urlsplit

import httpx
from protego import Protego

from ingest.sources.base import (
    Changed,
    Failed,
    ItemState,
    ScanEvent,
    Skipped,
    SourceError,
    Unchanged,
)
from ingest.sources.credentials import Credentials, same_origin
from ingest.sources.deadline import Deadline, RunOverdue
from ingest.sources.guard import AddressRefused, Guard, guarded_client
from ingest.sources.weblinks import (
    Site,
    document_name,
    normalise,
    page_links,
    sitemap_locations,
)

REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 5
GONE = (404, 410)
MAX_SITEMAPS = 50
"""Sitemap files read at most (an index and the sitemaps it lists)."""


class FetchFailed(Exception):
    """One request could not be made or answered (a timeout, a refused redirect, too big)."""


@dataclass
class CrawlStats:
    """What the last scan did, for tests and job counts."""

    requests: int = 0
    not_modified: int = 0
    fetched: int = 0
    failed: int = 0
    skipped: int = 0
    """Pages whose type no loader reads (images, archives …): yielded as `Skipped`."""
    disallowed: int = 0
    """Pages robots.txt disallows for our user agent: not fetched, not yielded (gone)."""
    from_sitemap: bool = False


@dataclass
class _Answer:
    status: int
    url: str
    headers: httpx.Headers
    body: bytes = b""


@dataclass
class _Visit:
    """One page's outcome: its event (None: gone), the links that lead on, and whether the
    server answered it (200 or 304) or why not."""

    event: ScanEvent | None
    links: tuple[str, ...]
    reached: bool = False
    problem: str = ""
    final_url: str = ""
    """Where the redirects, if any, ended."""


@dataclass
class _Pacer:
    """At most one request per `interval` seconds to one host."""

    interval: float
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    _next: dict[str, float] = field(default_factory=dict)

    def wait(self, url: str) -> None:
        host = urlsplit(url).netloc
        now = self.clock()
        due = self._next.get(host, now)
        if due > now:
            self.sleep(due - now)
            now = due
        self._next[host] = now + self.interval

    def slow_to(self, interval: float) -> None:
        """Make the interval at least `interval`, the request just made included."""
        if interval > self.interval:
            extra = interval - self.interval
            self._next = {host: due + extra for host, due in self._next.items()}
            self.interval = interval


class WebReader:
    """Crawls one site (see the module). `complete` is False after a scan that stopped at
    `max_pages` with pages left, so the sync deletes nothing it did not reach."""

    def __init__(
        self,
        start_url: str,
        *,
        depth: int = 3,
        max_pages: int = 1000,
        rate: float = 2.0,
        allow_private: bool = False,
        user_agent: str = "ragservice/0.1",
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        timeout: float = 30.0,
        response_seconds: float = 60.0,
        run_seconds: float | None = None,
        max_bytes: int = 32 * 2**20,
        guard: Guard | None = None,
        sleep: Callable[[float], None] = time.sleep,
        credentials: Credentials | None = None,
    ) -> None:
        if rate <= 0 or max_pages < 1 or depth < 0 or max_bytes < 1 or response_seconds <= 0:
            raise ValueError(
                "rate, max_pages, max_bytes and response_seconds must be positive, "
                "depth not negative"
            )
        self.site = Site.of(start_url)
        self.depth = depth
        self.max_pages = max_pages
        self.rate = rate
        self.user_agent = user_agent
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        self.timeout = timeout
        self.response_seconds = response_seconds
        """An answer's deadline: from its request to its last byte (a redirect's anew)."""
        self.run_seconds = run_seconds
        """A scan's deadline (None: none): past it, the scan raises `RunOverdue`."""
        self.max_bytes = max_bytes
        self.guard = guard or Guard(allow_private=allow_private)
        self.sleep = sleep
        self.auth = None if credentials is None else httpx.BasicAuth(*credentials.as_pair())
        """HTTP Basic credentials, sent to the start URL's origin only (never on a redirect
        or to a sitemap elsewhere: `ingest.sources.credentials`)."""
        self.complete = False
        self.stats = CrawlStats()

    def scan(self, known: Mapping[str, ItemState]) -> Iterator[ScanEvent]:
        """Yields an event per page reached; raises SourceError when the start URL cannot be
        fetched (refused by the guard, unresolvable, down, not found) or robots.txt fails."""
        self.complete = False
        self.stats = CrawlStats()
        deadline = Deadline()
        with guarded_client(
            self.guard, timeout=self.timeout, user_agent=self.user_agent, deadline=deadline
        ) as http:
            crawl = _Crawl(self, http, known, deadline)
            yield from crawl.run()
            self.complete = crawl.complete

    def wanted(self, url: str) -> bool:
        """Whether `url` is on the site and passes include/exclude (globs on its path)."""
        if not self.site.holds(url):
            return False
        path = urlsplit(url).path or "/"
        if any(fnmatchcase(path, glob) for glob in self.exclude):
            return False
        return not self.include or any(fnmatchcase(path, glob) for glob in self.include)


class _Crawl:
    """One scan's state: the queue, what was seen, robots and the pacer."""

    def __init__(
        self,
        reader: WebReader,
        http: httpx.Client,
        known: Mapping[str, ItemState],
        deadline: Deadline,
    ) -> None:
        self.reader = reader
        self.deadline = deadline
        run = reader.run_seconds
        self.run_due = None if run is None else deadline.clock() + run
        self.stats = reader.stats
        self.http = http
        self.known = known
        self.pacer = _Pacer(1.0 / reader.rate, sleep=reader.sleep)
        self.robots = Protego.parse("")
        self.complete = False

    def run(self) -> Iterator[ScanEvent]:
        start = self.reader.site.start
        self.robots = self._robots()
        if not self._allowed(start):
            raise SourceError(
                f"robots.txt disallows the start page {start} to {self.reader.user_agent}; "
                "nothing is fetched"
            )
        delay = self.robots.crawl_delay(self.reader.user_agent)
        if delay:
            self.pacer.slow_to(float(delay))
        first = self._start_page()
        listed = self._sitemap_pages()
        self.stats.from_sitemap = bool(listed)
        queue: deque[tuple[str, int]] = deque([(start, 0)])
        seen = {start}
        for url in listed:
            if url not in seen:
                seen.add(url)
                queue.append((url, 0))
        fetched = 0
        while queue:
            if fetched >= self.reader.max_pages:
                return  # capped with pages left: not complete
            url, level = queue.popleft()
            if not self._allowed(url):
                self.stats.disallowed += 1
                continue
            fetched += 1
            visit = first if url == start else self._page(url)
            if visit.event is not None:
                yield visit.event
            if listed or level >= self.reader.depth:
                continue
            for link in visit.links:
                if link not in seen and self.reader.wanted(link):
                    seen.add(link)
                    queue.append((link, level + 1))
        self.complete = True

    def _robots(self) -> Protego:
        url = self.reader.site.root + "/robots.txt"
        try:
            answer = self._get(url, {})
        except FetchFailed as exc:
            raise SourceError(f"{url} cannot be fetched: {exc}") from exc
        if answer.status >= 500:
            raise SourceError(f"{url} answered {answer.status}; the site is not crawled now")
        if answer.status != 200:
            return Protego.parse("")  # no robots.txt: everything is allowed
        return Protego.parse(answer.body.decode("utf-8", "replace"))

    def _start_page(self) -> _Visit:
        start = self.reader.site.start
        visit = self._page(start)
        if not visit.reached:
            raise SourceError(f"the start page {start} cannot be fetched: {visit.problem}")
        final = normalise(visit.final_url) or start
        if not self.reader.site.holds(final):
            # Its links would all be off the site: the crawl would find the start page alone
            # and call every other page gone.
            raise SourceError(
                f"the start page {start} redirects to {final}, outside the site; "
                "give that URL as the source's location"
            )
        return visit

    def _allowed(self, url: str) -> bool:
        return bool(self.robots.can_fetch(url, self.reader.user_agent))

    def _sitemap_pages(self) -> list[str]:
        """The wanted pages of the sitemaps robots.txt names, `/sitemap.xml` and the sitemaps
        their indexes list, breadth first: each sitemap once, MAX_SITEMAPS at most (those
        robots.txt disallows, not fetched, among them). Linear in what the sitemaps list."""
        root = self.reader.site.root
        pending: deque[str] = deque()
        queued: set[str] = set()  # every sitemap ever queued: none is read twice

        def queue(urls: Iterable[str]) -> None:
            for url in urls:
                if len(queued) >= MAX_SITEMAPS:
                    return  # the sitemaps queued already are all that will be read
                if url in queued:
                    continue
                queued.add(url)
                if self._allowed(url):
                    pending.append(url)
                else:
                    self.stats.disallowed += 1

        queue([*self.robots.sitemaps, root + "/sitemap.xml"])
        pages: list[str] = []
        while pending:
            url = pending.popleft()
            try:
                answer = self._get(url, {})
            except FetchFailed:
                continue
            if answer.status != 200:
                continue
            try:
                children, locations = sitemap_locations(answer.body, self.reader.max_bytes)
            except ValueError:
                continue
            queue(children)
            pages.extend(loc for loc in locations if self.reader.wanted(loc))
        return list(dict.fromkeys(pages))

    def _page(self, url: str) -> _Visit:
        prior = self.known.get(url)
        known_links = prior.links if prior else ()
        try:
            answer = self._get(url, _validators(prior))
        except FetchFailed as exc:
            self.stats.failed += 1
            return _Visit(Failed(url, str(exc)), known_links, problem=str(exc))
        if answer.status == 304 and prior is not None:
            self.stats.not_modified += 1
            return _Visit(Unchanged(url, prior), prior.links, reached=True, final_url=answer.url)
        if answer.status in GONE:
            return _Visit(None, (), problem=f"HTTP {answer.status}")
        if answer.status != 200:
            self.stats.failed += 1
            reason = f"answered HTTP {answer.status}"
            return _Visit(Failed(url, reason), known_links, problem=reason)
        visit = self._fetched(url, answer, prior)
        visit.final_url = answer.url
        return visit

    def _fetched(self, url: str, answer: _Answer, prior: ItemState | None) -> _Visit:
        content_type = answer.headers.get("content-type", "")
        links = page_links(answer.body, answer.url, content_type, self.reader.wanted)
        state = ItemState(
            etag=answer.headers.get("etag"),
            last_modified=answer.headers.get("last-modified"),
            content_hash=hashlib.sha256(answer.body).hexdigest(),
            links=links,
        )
        name = document_name(answer.url, content_type)
        if name is None:
            self.stats.skipped += 1
            kind = content_type.split(";", 1)[0].strip() or "(none)"
            return _Visit(Skipped(url, f"unsupported content type {kind}"), links, reached=True)
        self.stats.fetched += 1
        if prior is not None and prior.content_hash == state.content_hash:
            return _Visit(Unchanged(url, state), links, reached=True)
        origin: dict[str, Any] = {
            "url": url,
            "etag": state.etag,
            "last_modified": state.last_modified,
            "content_type": content_type or None,
        }
        return _Visit(Changed(url, name, answer.body, state, origin), links, reached=True)

    def _get(self, url: str, headers: Mapping[str, str]) -> _Answer:
        """GET `url`, following up to MAX_REDIRECTS redirects (each one guarded), with the
        body read up to max_bytes; raises FetchFailed for what is no HTTP answer."""
        for _ in range(MAX_REDIRECTS + 1):
            answer = self._request(url, headers)
            location = answer.headers.get("location")
            if answer.status not in REDIRECTS or not location:
                return answer
            url = str(httpx.URL(answer.url).join(location))
        raise FetchFailed(f"more than {MAX_REDIRECTS} redirects")

    def _request(self, url: str, headers: Mapping[str, str]) -> _Answer:
        """One GET, over by the answer's deadline (or the run's, when sooner): raises
        FetchFailed for that page, or RunOverdue when the run's time is up."""
        self.pacer.wait(url)
        clock = self.deadline.clock
        run_due = self.run_due
        if run_due is not None and clock() >= run_due:
            raise RunOverdue(self.reader.run_seconds or 0)
        due = clock() + self.reader.response_seconds
        self.deadline.at = due if run_due is None else min(due, run_due)
        self.stats.requests += 1
        try:
            return self._answer(url, headers)
        except FetchFailed:
            if run_due is not None and clock() >= run_due:
                raise RunOverdue(self.reader.run_seconds or 0) from None
            if clock() >= due:
                seconds = self.reader.response_seconds
                raise FetchFailed(f"no whole answer within {seconds:g} s") from None
            raise
        finally:
            self.deadline.at = None

    def _answer(self, url: str, headers: Mapping[str, str]) -> _Answer:
        try:
            auth = self.reader.auth if same_origin(url, self.reader.site.root) else None
            with self.http.stream("GET", url, headers=dict(headers), auth=auth) as response:
                body = b""
                if response.status_code == 200:
                    body = _read_bounded(response, self.reader.max_bytes)
                return _Answer(response.status_code, str(response.url), response.headers, body)
        except AddressRefused as exc:
            raise FetchFailed(str(exc)) from exc
        except SourceError as exc:  # DNS failed
            raise FetchFailed(str(exc)) from exc
        except httpx.TimeoutException as exc:
            raise FetchFailed(f"timed out ({type(exc).__name__})") from exc
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise FetchFailed(f"{type(exc).__name__}: {exc}") from exc


def _validators(prior: ItemState | None) -> dict[str, str]:
    headers: dict[str, str] = {}
    if prior is not None and prior.etag:
        headers["If-None-Match"] = prior.etag
    if prior is not None and prior.last_modified:
        headers["If-Modified-Since"] = prior.last_modified
    return headers


def _read_bounded(response: httpx.Response, limit: int) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise FetchFailed(f"{declared} bytes, over the limit of {limit}")
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > limit:
            raise FetchFailed(f"over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
