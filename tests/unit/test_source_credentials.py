"""A source's credentials: split off its location, kept out of messages, and sent by the web
reader to the source's own host only (not on a redirect or to a sitemap elsewhere)."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import ingest.sources as sources
from ingest.sources.base import Changed
from ingest.sources.credentials import Credentials, redact, same_origin, split_location
from ingest.sources.web import WebReader
from ragservice.config import Settings

BASIC = "Basic " + base64.b64encode(b"ana:pa@ss:word").decode()


@pytest.mark.parametrize(
    ("location", "clean", "credentials"),
    [
        (
            "https://ana:pa%40ss@docs.example.com/a/",
            "https://docs.example.com/a/",
            ("ana", "pa@ss"),
        ),
        (
            "https://ana:pa@ss@docs.example.com:8443/",
            "https://docs.example.com:8443/",
            ("ana", "pa@ss"),
        ),
        ("https://TOKEN123@git.example.com/x", "https://git.example.com/x", ("TOKEN123", "")),
        ("s3://AKIAX:wJalr%2FK7@bucket/prefix", "s3://bucket/prefix", ("AKIAX", "wJalr/K7")),
        ("https://docs.example.com/a/", "https://docs.example.com/a/", None),
        ("https://@docs.example.com/", "https://docs.example.com/", None),
        ("/srv/handbook", "/srv/handbook", None),
    ],
)
def test_a_location_is_split_from_its_credentials(
    location: str, clean: str, credentials: tuple[str, str] | None
) -> None:
    found, given = split_location(location)
    assert found == clean
    assert (None if given is None else (given.username, given.password)) == credentials


def test_messages_lose_user_information_and_secrets() -> None:
    secret = Credentials("ana", "hunter22")
    text = "GET https://ana:hunter22@example.com/x failed; password hunter22"
    assert redact(text, secret) == "GET https://***@example.com/x failed; password ***"
    assert redact("http://tok@h/ and s3://K:S@b/p") == "http://***@h/ and s3://***@b/p"
    assert "hunter22" not in repr(secret) and "ana" not in repr(secret)
    assert Credentials("TOKEN123").secrets() == ("TOKEN123",)


def test_the_origin_is_scheme_host_and_port() -> None:
    assert same_origin("http://127.0.0.1:8080/docs/x", "http://127.0.0.1:8080")
    assert same_origin("HTTP://127.0.0.1:8080/", "http://127.0.0.1:8080")
    assert not same_origin("http://127.0.0.1:8081/docs/x", "http://127.0.0.1:8080")
    assert not same_origin("https://127.0.0.1:8080/docs/x", "http://127.0.0.1:8080")
    assert not same_origin("http://127.0.0.1.evil.example:8080/", "http://127.0.0.1:8080")


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        server = self.server
        server.seen.append((self.path, self.headers.get("Authorization")))  # type: ignore[attr-defined]
        routes: dict[str, tuple[int, str, bytes]] = server.routes  # type: ignore[attr-defined]
        status, location, body = routes.get(self.path, (404, "", b""))
        self.send_response(status)
        if location:
            self.send_header("Location", location)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def two_hosts() -> Iterator[tuple[ThreadingHTTPServer, ThreadingHTTPServer]]:
    """Two servers on loopback, on two ports: two origins."""
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _Handler) for _ in range(2)]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for server, thread in zip(servers, threads, strict=True):
        server.seen = []  # type: ignore[attr-defined]
        server.routes = {}  # type: ignore[attr-defined]
        thread.start()
    yield servers[0], servers[1]
    for server in servers:
        server.shutdown()
        server.server_close()


def test_the_web_reader_signs_requests_to_its_own_host_only(
    two_hosts: tuple[ThreadingHTTPServer, ThreadingHTTPServer],
) -> None:
    site, elsewhere = two_hosts
    base = f"http://127.0.0.1:{site.server_address[1]}"
    other = f"http://127.0.0.1:{elsewhere.server_address[1]}"
    page = b'<html><body><a href="moved.html">moved</a><a href="next.html">n</a></body></html>'
    site.routes = {  # type: ignore[attr-defined]
        "/robots.txt": (200, "", f"Sitemap: {other}/sitemap.xml\n".encode()),
        "/docs/": (200, "", page),
        "/docs/moved.html": (302, f"{other}/docs/moved.html", b""),
        "/docs/next.html": (200, "", b"<html><body>next</body></html>"),
    }
    elsewhere.routes = {"/docs/moved.html": (200, "", b"<html><body>there</body></html>")}  # type: ignore[attr-defined]
    reader = sources.reader_for(
        f"{base}/docs/",
        {"rate": 100},
        credentials=Credentials("ana", "pa@ss:word"),
        settings=Settings(sources_allow_private=True, crawl_rate=100.0).sources,
    )
    assert isinstance(reader, WebReader)
    events = list(reader.scan({}))

    assert {e.key for e in events if isinstance(e, Changed)} == {
        f"{base}/docs/",
        f"{base}/docs/moved.html",
        f"{base}/docs/next.html",
    }
    assert site.seen and all(auth == BASIC for _, auth in site.seen)  # type: ignore[attr-defined]
    assert {path for path, _ in elsewhere.seen} >= {"/sitemap.xml", "/docs/moved.html"}  # type: ignore[attr-defined]
    assert all(auth is None for _, auth in elsewhere.seen)  # type: ignore[attr-defined]
