"""A folder served on loopback behind HTTP Basic auth: requests with the right credentials
get its files, the others a 401; every request's Authorization header is recorded."""

from __future__ import annotations

import base64
import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any


def basic(user: str, secret: str) -> str:
    """The Authorization header of HTTP Basic for `user` and `secret`."""
    return "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()


class _LockedHandler(http.server.SimpleHTTPRequestHandler):
    expected: str
    seen: list[str | None]

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        if self.headers.get("Authorization") != self.expected:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="docs"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def locked_site(
    root: Path, user: str, secret: str, start: str = "index.html"
) -> Iterator[tuple[str, list[str | None]]]:
    """`root` served until the block ends: the URL of `start` (no credentials in it) and the
    Authorization headers sent so far."""
    seen: list[str | None] = []
    handler = type("Handler", (_LockedHandler,), {"seen": seen, "expected": basic(user, secret)})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(handler, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{start}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
