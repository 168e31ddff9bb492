"""The SSRF guard's address policy over the special-purpose ranges (IANA's IPv4 and IPv6
special-purpose registries), the deprecated ones included: none of them is a public host."""

from __future__ import annotations

import ipaddress

import pytest

from ingest.sources.guard import refusal

NOT_PUBLIC = (
    # IPv6
    "fec0::1",  # site-local, deprecated (RFC 3879)
    "fed0:1234::5",
    "feff:ffff::1",
    "fc00::1",
    "fdff::1",  # unique local
    "fe80::1",
    "febf::1",  # link-local
    "::1",
    "::",
    "::ffff:10.0.0.1",
    "::10.0.0.1",  # IPv4-compatible, deprecated
    "64:ff9b::7f00:1",  # NAT64 of loopback
    "64:ff9b:1::1",  # local-use NAT64
    "100::1",  # discard-only
    "2001:2::1",  # benchmarking
    "2001:10::1",  # ORCHID
    "2001:20::1",  # ORCHIDv2
    "2001:db8::1",  # documentation
    "3fff::1",  # documentation (RFC 9637)
    "5f00::1",  # SRv6 SIDs
    "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
    "2001:0:4136:e378:8000:63bf:f5ff:fffe",  # Teredo of 10.0.0.1
    "ff02::1",
    "ff0e::1",  # multicast, global scope too
    # IPv4
    "0.1.2.3",
    "10.0.0.1",
    "100.64.0.1",
    "127.0.0.2",
    "169.254.0.1",
    "172.31.255.255",
    "192.0.0.1",  # IETF protocol assignments
    "192.0.2.1",
    "198.51.100.1",
    "203.0.113.1",  # documentation
    "192.88.99.1",  # 6to4 relay anycast, deprecated (RFC 7526)
    "192.168.0.1",
    "198.18.0.1",
    "198.19.255.255",  # benchmarking
    "224.0.0.1",
    "239.255.255.250",  # multicast
    "240.0.0.1",
    "255.255.255.255",
)
PUBLIC = (
    "1.1.1.1",
    "8.8.8.8",
    "100.128.0.1",
    "192.88.100.1",
    "2606:4700::1111",
    "2a00:1450:4001::1",
    "::ffff:8.8.8.8",
    "64:ff9b::808:808",
    "2002:808:808::1",
)


@pytest.mark.parametrize("address", NOT_PUBLIC)
def test_every_special_purpose_address_is_refused(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is not None


def test_a_site_local_address_is_refused_as_such() -> None:
    assert refusal(ipaddress.ip_address("fec0::1")) == "site-local"


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_still_pass(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None
