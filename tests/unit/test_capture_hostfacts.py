"""Host facts (IPv6 mode, DNS servers) and the small process runner."""

from __future__ import annotations

import pytest

from istio_agent.capture.addr import parse_addr
from istio_agent.capture.hostfacts import (
    HostFactError,
    ipv6_from_addresses,
    parse_resolv_conf,
    split_servers,
)


def addrs(*pairs: tuple[int, str]) -> list[tuple[int, bytes]]:
    return [(index, parse_addr(text)) for index, text in pairs]


def test_first_usable_address_decides_without_dual_stack() -> None:
    assert ipv6_from_addresses(addrs((1, "127.0.0.1"), (1, "::1"), (2, "10.0.0.2"), (2, "fd00::2")), False) is False
    assert ipv6_from_addresses(addrs((2, "fe80::1"), (2, "fd00::2"), (3, "10.0.0.2")), False) is True
    # interfaces are walked in index order, whatever the dump order
    assert ipv6_from_addresses(addrs((5, "10.0.0.2"), (3, "fd00::2")), False) is True


def test_dual_stack_means_any_usable_ipv6() -> None:
    assert ipv6_from_addresses(addrs((2, "10.0.0.2"), (4, "fd00::2")), True) is True
    assert ipv6_from_addresses(addrs((2, "10.0.0.2"), (4, "fe80::2")), True) is False


def test_no_usable_address_is_an_error_like_upstream() -> None:
    with pytest.raises(HostFactError, match="no valid local IP address"):
        ipv6_from_addresses(addrs((1, "127.0.0.1"), (1, "::1"), (2, "169.254.3.4"), (2, "fe80::1")), False)


def test_resolv_conf_parsing() -> None:
    body = """# generated
search svc.cluster.local
nameserver 10.96.0.10
nameserver ::127.0.0.53
; comment
nameserver resolver.local
nameserver fe80::1%eth0
nameserver 10.0.0.1%eth0
nameserver fe80::2%
options ndots:5
nameserver 8.8.8.8 # trailing
"""
    # A zone is kept on IPv6 (Go's netip.ParseAddr reads it); on IPv4, or empty, the line is skipped as upstream does.
    assert parse_resolv_conf(body) == (["10.96.0.10", "8.8.8.8"], ["::7f00:35", "fe80::1%eth0"])


def test_pinned_servers_stay_verbatim() -> None:
    assert split_servers(["::127.0.0.53", "1.1.1.1"]) == (["1.1.1.1"], ["::127.0.0.53"])
    with pytest.raises(ValueError):
        split_servers(["dns.example"])
