"""The SSRF guard: a source given by a tenant must not reach inside the service's network.

A web source's pages (and every redirect) and an S3 endpoint are fetched from the service's
own machines, which may see cloud metadata (169.254.169.254), the database, or other private
services. The guard resolves a host to all its addresses and refuses the host when any of them
is not a public one: private, loopback, link-local, site-local (IPv6's deprecated fec0::/10),
multicast, reserved, unspecified, shared (CGNAT, 100.64/10), documentation, benchmarking and
the other special-purpose ranges (Python's `ipaddress` tables, with the few they miss), or an
IPv6 address that embeds one of those (IPv4-mapped, 6to4, Teredo, NAT64).
`RAGSERVICE_SOURCES_ALLOW_PRIVATE` (an operator's choice) lets such addresses through.

For HTTP the check is made at connect time, in the network backend of the client
(`guarded_transport`): every connection, the first and each redirect's, is opened to the very
address that was checked, while the Host header and TLS SNI keep the host name. A name that
resolves to a public address when checked and to a private one when connected (DNS rebinding)
therefore gains nothing. Proxies from the environment are not used (a proxy would connect for
us, unchecked).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Sequence
from typing import TypeAlias
from urllib.parse import urlsplit

import httpcore
import httpx

from ingest.sources.base import SourceError
from ingest.sources.deadline import Deadline, DeadlineStream

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver: TypeAlias = Callable[[str, int], Sequence[str]]
"""(host, port) → the host's addresses as strings; raises OSError when it has none."""

SCHEMES = ("http", "https")
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SPECIAL: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...] = (
    (ipaddress.ip_network("192.88.99.0/24"), "deprecated (6to4 relay anycast)"),
    (ipaddress.ip_network("3fff::/20"), "documentation"),
)
"""Special-purpose ranges that `ipaddress` (as of Python 3.11) does not count as non-global."""
_ALLOW_HINT = "RAGSERVICE_SOURCES_ALLOW_PRIVATE allows it"


class AddressRefused(SourceError):
    """The guard refused a host: a scheme other than http(s), or an address not public."""


class Unresolvable(SourceError):
    """The host has no address (DNS failed)."""


def system_resolver(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (IPv4 and IPv6), by the system's resolver."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: list[str] = []
    for info in infos:
        address = str(info[4][0]).split("%", 1)[0]  # an IPv6 scope id is no part of the address
        if address not in found:
            found.append(address)
    return found


def refusal(address: IPAddress) -> str | None:
    """Why `address` is not a public one ("loopback", "private" …), or None when it is."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            inner = refusal(embedded)
            if inner is not None:
                return f"{inner} (embedded in an IPv6 address)"
            if address.ipv4_mapped is not None or address in _NAT64:
                return None  # the address that is really reached is the public IPv4 one
    checks = (
        (address.is_unspecified, "unspecified"),
        (address.is_loopback, "loopback"),
        (address.is_link_local, "link-local"),
        (isinstance(address, ipaddress.IPv6Address) and address.is_site_local, "site-local"),
        (address.is_multicast, "multicast"),
        (address in _CGNAT, "shared (CGNAT)"),
        (address.is_private, "private"),
        (address.is_reserved, "reserved"),
        (not address.is_global, "non-public"),
    )
    reason = next((reason for failed, reason in checks if failed), None)
    if reason is None:
        reason = next((why for network, why in _SPECIAL if address in network), None)
    return reason


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


class Guard:
    """Checks hosts before anything connects to them; `allow_private` turns the address check
    off (schemes are still checked). `resolver` and `policy` (why an address is refused) are
    injectable, so that tests need no real DNS and can refuse one loopback address only."""

    def __init__(
        self,
        *,
        allow_private: bool = False,
        resolver: Resolver = system_resolver,
        policy: Callable[[IPAddress], str | None] = refusal,
    ) -> None:
        self.allow_private = allow_private
        self.resolver = resolver
        self.policy = policy

    def check_url(self, url: str) -> list[str]:
        """The addresses `url`'s host may be reached at; raises AddressRefused for a scheme
        other than http(s) or a refused address, Unresolvable when the host has none."""
        parts = urlsplit(url)
        if parts.scheme.lower() not in SCHEMES:
            raise AddressRefused(f"{url}: only http and https URLs are fetched")
        if not parts.hostname:
            raise AddressRefused(f"{url}: the URL names no host")
        try:
            port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
        except ValueError as exc:
            raise AddressRefused(f"{url}: {exc}") from exc
        return self.check_host(parts.hostname, port)

    def check_host(self, host: str, port: int) -> list[str]:
        """The addresses `host` resolves to, each checked; raises AddressRefused when one is
        refused (one bad address is enough: the system may pick any of them)."""
        addresses = self._resolve(host, port)
        if self.allow_private:
            return addresses
        for text in addresses:
            reason = self.policy(ipaddress.ip_address(text))
            if reason is not None:
                raise AddressRefused(
                    f"{host} resolves to {text}, a {reason} address: refused ({_ALLOW_HINT})"
                )
        return addresses

    def _resolve(self, host: str, port: int) -> list[str]:
        literal = _literal(host)
        if literal is not None:
            return [literal]
        try:
            addresses = [text.split("%", 1)[0] for text in self.resolver(host, port)]
        except (OSError, UnicodeError) as exc:
            raise Unresolvable(f"{host} cannot be resolved: {exc}") from exc
        if not addresses:
            raise Unresolvable(f"{host} cannot be resolved: no address")
        return addresses


def _literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


class _GuardedBackend(httpcore.SyncBackend):
    """httpcore's network backend, connecting only to addresses the guard checked, with
    streams whose waits end at `deadline` (when given)."""

    def __init__(self, guard: Guard, deadline: Deadline | None = None) -> None:
        self.guard = guard
        self.deadline = deadline

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        addresses = self.guard.check_host(host, port)
        error: Exception | None = None
        for address in addresses:  # the checked addresses themselves: no second lookup
            try:
                if self.deadline is None:
                    return super().connect_tcp(
                        address, port, timeout, local_address, socket_options
                    )
                capped = self.deadline.cap(timeout, httpcore.ConnectTimeout)
                stream = super().connect_tcp(address, port, capped, local_address, socket_options)
                return DeadlineStream(stream, self.deadline)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        assert error is not None
        raise error


class GuardedTransport(httpx.HTTPTransport):
    """An httpx transport whose every connection goes through the guard (see the module)."""

    def __init__(
        self, guard: Guard, *, verify: bool = True, deadline: Deadline | None = None
    ) -> None:
        super().__init__(verify=verify, trust_env=False)
        ssl_context = httpx.create_ssl_context(verify=verify, trust_env=False)
        # httpx builds its pool without a way to pass a network backend; this is its pool
        # with ours (the same arguments httpx passes by default).
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context,
            max_connections=100,
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
            network_backend=_GuardedBackend(guard, deadline),
        )


def guarded_client(
    guard: Guard, *, timeout: float, user_agent: str, deadline: Deadline | None = None
) -> httpx.Client:
    """A sync httpx client for a source: guarded connections, no environment proxies, and
    redirects left to the caller (each redirect is a new, checked, connection). `timeout`
    bounds a connect and each read; `deadline`, set by the caller before a request, bounds
    the whole request, however slowly its answer comes (`ingest.sources.deadline`)."""
    return httpx.Client(
        transport=GuardedTransport(guard, deadline=deadline),
        timeout=httpx.Timeout(timeout),
        headers={"User-Agent": user_agent},
        follow_redirects=False,
        trust_env=False,
    )
