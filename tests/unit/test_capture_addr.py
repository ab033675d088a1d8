"""Address and prefix handling must print what Go's net/netip prints."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from istio_agent.capture.addr import format_addr, is_link_local, is_loopback, parse_addr, parse_prefix


@given(st.binary(min_size=16, max_size=16))
def test_ipv6_text_matches_rfc5952_form(packed: bytes) -> None:
    """Outside IPv4-mapped addresses, Go and Python agree on the canonical form."""
    if packed[:12] == bytes(10) + b"\xff\xff":
        return
    text = format_addr(packed)
    assert text == str(ipaddress.IPv6Address(packed))
    assert parse_addr(text) == packed


@given(st.binary(min_size=4, max_size=4))
def test_ipv4_round_trip(packed: bytes) -> None:
    assert parse_addr(format_addr(packed)) == packed


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("::127.0.0.53", "::7f00:35"),  # the kit's documented resolv.conf difference
        ("::ffff:1.2.3.4", "::ffff:1.2.3.4"),  # Go keeps the dotted tail for mapped addresses
        ("2001:DB8::1", "2001:db8::1"),
        ("1:0:0:1:0:0:0:1", "1:0:0:1::1"),  # the longest run wins
        ("1:0:0:1:0:0:1:1", "1::1:0:0:1:1"),  # the first of equal runs wins
        ("1:0:1:1:1:1:1:1", "1:0:1:1:1:1:1:1"),  # a single zero group is not compressed
    ],
)
def test_canonical_text(text: str, canonical: str) -> None:
    assert format_addr(parse_addr(text)) == canonical


@pytest.mark.parametrize(
    "text", ["", "1.2.3", "010.0.0.1", "1.2.3.4 ", "fe80::1%eth0", "::g", "1.2.3.4/32", "eth0 -j ACCEPT"]
)
def test_bad_addresses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_addr(text)


def test_prefixes_keep_the_address_as_written() -> None:
    assert parse_prefix("10.0.0.1/8").text == "10.0.0.1/8"
    assert parse_prefix("2001:DB8::/32").text == "2001:db8::/32"
    assert parse_prefix("0.0.0.0/0").bits == 0


@pytest.mark.parametrize("text", ["10.0.0.0", "10.0.0.0/33", "::/129", "10.0.0.0/08", "10.0.0.0/-1", "/8", "x/8"])
def test_bad_prefixes(text: str) -> None:
    with pytest.raises(ValueError):
        parse_prefix(text)


def test_loopback_and_link_local() -> None:
    assert is_loopback(parse_addr("127.1.2.3")) and is_loopback(parse_addr("::1"))
    assert is_loopback(parse_addr("::ffff:127.0.0.1"))
    assert not is_loopback(parse_addr("::2"))
    assert is_link_local(parse_addr("169.254.0.9")) and is_link_local(parse_addr("fe80::1"))
    assert is_link_local(parse_addr("ff02::1")) and is_link_local(parse_addr("224.0.0.5"))
    assert not is_link_local(parse_addr("10.0.0.1")) and not is_link_local(parse_addr("fd00::1"))
