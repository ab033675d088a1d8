"""netaddr: the one `host:port` splitter (Go's net.SplitHostPort rules, numeric port)."""

from __future__ import annotations

import pytest

from istio_agent.netaddr import AddressError, split_host_optional_port, split_host_port


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("localhost:15053", ("localhost", 15053)),
        ("0.0.0.0:15053", ("0.0.0.0", 15053)),
        ("istiod.istio-system.svc:15012", ("istiod.istio-system.svc", 15012)),
        ("[::1]:53", ("::1", 53)),
        ("[fe80::1%eth0]:8080", ("fe80::1%eth0", 8080)),
        ("[$(HOST_IP)]:8126", ("$(HOST_IP)", 8126)),
        (":15053", ("", 15053)),
        ("[]:80", ("", 80)),
        ("host:0", ("host", 0)),
        ("host:65535", ("host", 65535)),
        ("host:080", ("host", 80)),
    ],
)
def test_split_host_port(address: str, expected: tuple[str, int]) -> None:
    assert split_host_port(address) == expected


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("localhost", "must be host:port"),
        ("", "must be host:port"),
        ("[::1]", "must be host:port"),
        ("::1:53", "IPv6 address '::1:53' must be written [addr]:port"),
        ("[::1:53", "without a matching ']'"),
        ("[::1]x:53", "text after ']'"),
        ("a]:53", "misplaced brackets"),
        ("[a]:[53]", "misplaced brackets"),
        ("greeter:http", "no numeric port"),
        ("greeter:", "no numeric port"),
        ("greeter:-1", "no numeric port"),
        ("greeter:+80", "no numeric port"),
        ("greeter: 80", "no numeric port"),
        ("greeter:\u0663", "no numeric port"),  # a non-ASCII digit
        ("greeter:65536", "port 65536 out of range"),
    ],
)
def test_split_host_port_refuses_naming_the_address(address: str, reason: str) -> None:
    with pytest.raises(AddressError) as err:
        split_host_port(address)
    message = str(err.value)
    assert reason in message
    assert repr(address) in message
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("greeter:50051", ("greeter", 50051)),
        ("[::1]:80", ("::1", 80)),
        ("greeter", ("greeter", None)),
        ("::1", ("::1", None)),
        ("[::1]", ("::1", None)),
        ("greeter:http", ("greeter:http", None)),
        ("greeter:", ("greeter:", None)),
        ("greeter:65536", ("greeter:65536", None)),
        (":80", (":80", None)),
        ("[::1", ("[::1", None)),
        ("", ("", None)),
    ],
)
def test_split_host_optional_port(address: str, expected: tuple[str, int | None]) -> None:
    assert split_host_optional_port(address) == expected


def test_join_host_port_brackets_ipv6_once() -> None:
    from istio_agent.netaddr import join_host_port

    assert join_host_port("10.0.0.1", 80) == "10.0.0.1:80"
    assert join_host_port("greeter.default.svc.cluster.local", 7070) == "greeter.default.svc.cluster.local:7070"
    assert join_host_port("fd00::1", 8080) == "[fd00::1]:8080"
    assert join_host_port("[fd00::1]", 8080) == "[fd00::1]:8080"
