"""A loopback site that records the paths it is asked for, whose pages may trickle: `/slow…`
paths send their body one byte every two seconds (a read never times out, the answer never ends
in time); `/pause…` paths answer after `PAUSE_SECONDS`; others answer at once, from `pages`
(a body, HTML, or a body and its content type; anything else is a 404)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DRIP_SECONDS = 2.0
PAUSE_SECONDS = 0.2


@dataclass
class SlowSite:
    pages: dict[str, bytes | tuple[bytes, str]] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        site: SlowSite = self.server.site  # type: ignore[attr-defined]
        with site.lock:
            site.asked.append(self.path)
        if self.path.startswith("/slow"):
            self._drip(site)
            return
        if self.path.startswith("/pause"):
            site.stop.wait(PAUSE_SECONDS)
        page = site.pages.get(self.path, (b"not found", "text/plain"))
        body, kind = page if isinstance(page, tuple) else (page, "text/html")
        self.send_response(200 if self.path in site.pages else 404)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _drip(self, site: SlowSite) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", "100000")
        self.end_headers()
        try:
            while not site.stop.wait(DRIP_SECONDS):
                self.wfile.write(b"x")
                self.wfile.flush()
        except OSError:  # the client hung up
            pass

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def slow_site(
    pages: dict[str, bytes | tuple[bytes, str]] | None = None,
) -> Iterator[tuple[SlowSite, str]]:
    """The site, served until the block ends; yields it and its base URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    site = SlowSite(pages=dict(pages or {}))
    httpd.site = site  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield site, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        site.stop.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join()
