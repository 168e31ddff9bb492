"""The SSRF guard: which addresses a source may reach, checked at every connection."""

from __future__ import annotations

import ipaddress
import re
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ingest.sources.base import SourceError
from ingest.sources.guard import (
    AddressRefused,
    Guard,
    IPAddress,
    Unresolvable,
    guarded_client,
    refusal,
)

REFUSED = {
    "127.0.0.1": "loopback",
    "10.1.2.3": "private",
    "172.16.0.1": "private",
    "192.168.1.1": "private",
    "169.254.169.254": "link-local",
    "100.64.0.1": "shared (CGNAT)",
    "100.127.255.254": "shared (CGNAT)",
    "0.0.0.0": "unspecified",
    "224.0.0.1": "multicast",
    "240.0.0.1": "private",
    "::1": "loopback",
    "::": "unspecified",
    "fe80::1": "link-local",
    "fc00::1": "private",
    "ff02::1": "multicast",
    "::ffff:127.0.0.1": "loopback (embedded in an IPv6 address)",
    "::ffff:169.254.169.254": "link-local (embedded in an IPv6 address)",
    "2002:a00:1::1": "private (embedded in an IPv6 address)",  # 6to4 of 10.0.0.1
    "64:ff9b::a9fe:a9fe": "link-local (embedded in an IPv6 address)",  # NAT64
}
PUBLIC = ("8.8.8.8", "93.184.216.34", "2606:4700::1111", "::ffff:8.8.8.8", "100.128.0.1")


@pytest.mark.parametrize("address", sorted(REFUSED))
def test_non_public_addresses_are_refused_with_the_reason(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) == REFUSED[address]


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_pass(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


def _resolver(table: dict[str, Sequence[str]]) -> object:
    def resolve(host: str, port: int) -> Sequence[str]:
        if host not in table:
            raise OSError("Name or service not known")
        return table[host]

    return resolve


def _guard(table: dict[str, Sequence[str]], **kwargs: object) -> Guard:
    return Guard(resolver=_resolver(table), **kwargs)  # type: ignore[arg-type]


def test_a_url_is_checked_by_every_address_of_its_host() -> None:
    guard = _guard({"good.test": ["8.8.8.8", "2606:4700::1111"], "mixed.test": ["8.8.8.8", "::1"]})
    assert guard.check_url("https://good.test/docs") == ["8.8.8.8", "2606:4700::1111"]
    with pytest.raises(
        AddressRefused, match=re.escape("mixed.test resolves to ::1, a loopback address")
    ):
        guard.check_url("http://mixed.test:8080/")


def test_literal_addresses_schemes_and_unknown_hosts() -> None:
    guard = _guard({})
    with pytest.raises(AddressRefused, match=re.escape("169.254.169.254, a link-local address")):
        guard.check_url("http://169.254.169.254/latest/meta-data/")
    with pytest.raises(AddressRefused, match=re.escape("::ffff:7f00:1")):
        guard.check_url("http://[::ffff:127.0.0.1]:9000/")
    for url in ("file:///etc/passwd", "ftp://good.test/", "gopher://x/"):
        with pytest.raises(AddressRefused, match="only http and https"):
            guard.check_url(url)
    with pytest.raises(Unresolvable, match=re.escape("nowhere.test cannot be resolved")):
        guard.check_url("http://nowhere.test/")
    assert issubclass(AddressRefused, SourceError) and issubclass(Unresolvable, SourceError)


def test_the_allow_setting_lets_private_addresses_through_but_not_other_schemes() -> None:
    guard = _guard({"db.internal": ["10.0.0.5"]}, allow_private=True)
    assert guard.check_url("http://db.internal:5432/") == ["10.0.0.5"]
    with pytest.raises(AddressRefused):
        guard.check_url("file:///etc/passwd")


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/hop":
            self.send_response(302)
            self.send_header("Location", self.server.redirect_to)  # type: ignore[attr-defined]
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = f"host={self.headers['Host']}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _only_127_0_0_2(address: IPAddress) -> str | None:
    """A policy under which the test server (127.0.0.1) is public and 127.0.0.2 is not."""
    return "loopback" if str(address) == "127.0.0.2" else None


def test_a_connection_goes_to_the_checked_address_with_the_host_name_kept(
    server: ThreadingHTTPServer,
) -> None:
    port = server.server_address[1]
    guard = _guard({"site.test": ["127.0.0.1"]}, policy=_only_127_0_0_2)
    with guarded_client(guard, timeout=5, user_agent="t") as http:
        answer = http.get(f"http://site.test:{port}/page")
    assert answer.text == f"host=site.test:{port}"


def test_a_name_that_rebinds_to_a_refused_address_is_refused_at_connect(
    server: ThreadingHTTPServer,
) -> None:
    port = server.server_address[1]
    answers = iter([["127.0.0.1"], ["127.0.0.2"]])

    def rebinding(host: str, port: int) -> Sequence[str]:
        return next(answers)

    guard = Guard(resolver=rebinding, policy=_only_127_0_0_2)
    with guarded_client(guard, timeout=5, user_agent="t") as http:
        assert http.get(f"http://rebind.test:{port}/").status_code == 200
        with pytest.raises(AddressRefused, match=re.escape("rebind.test resolves to 127.0.0.2")):
            http.get(f"http://rebind.test:{port}/")  # the server closed: a new connection


def test_a_redirect_to_a_refused_address_is_refused(server: ThreadingHTTPServer) -> None:
    port = server.server_address[1]
    server.redirect_to = f"http://127.0.0.2:{port}/"  # type: ignore[attr-defined]
    guard = _guard({}, policy=_only_127_0_0_2)
    with guarded_client(guard, timeout=5, user_agent="t") as http:
        hop = http.get(f"http://127.0.0.1:{port}/hop")
        assert hop.status_code == 302  # redirects are the caller's, each one checked
        with pytest.raises(AddressRefused, match=re.escape("127.0.0.2, a loopback address")):
            http.get(hop.headers["location"])
