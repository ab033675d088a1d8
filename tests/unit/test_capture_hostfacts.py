"""Host facts (IPv6 mode, DNS servers) and the small process runner."""

from __future__ import annotations

import subprocess

import pytest
from needs import need_tool

from istio_agent.capture.addr import format_addr, parse_addr
from istio_agent.capture.hostfacts import (
    HostFactError,
    interface_addresses,
    ipv6_from_addresses,
    parse_resolv_conf,
    split_servers,
)
from istio_agent.capture.procs import CommandError, run


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


def test_netlink_dump_matches_ip_addr() -> None:
    ip = need_tool("ip")
    listed = subprocess.run([ip, "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    expected = set()
    for line in listed.splitlines():
        words = line.split()
        family_at = 2
        if words[family_at] in ("inet", "inet6"):
            address = words[family_at + 1].split("/")[0].split("%")[0]
            expected.add((int(words[0].rstrip(":")), address))
    got = {(index, format_addr(packed)) for index, packed in interface_addresses()}
    assert got == expected


def test_resolv_conf_parsing() -> None:
    body = """# generated
search svc.cluster.local
nameserver 10.96.0.10
nameserver ::127.0.0.53
; comment
nameserver resolver.local
nameserver fe80::1%eth0
options ndots:5
nameserver 8.8.8.8 # trailing
"""
    assert parse_resolv_conf(body) == (["10.96.0.10", "8.8.8.8"], ["::7f00:35"])


def test_pinned_servers_stay_verbatim() -> None:
    assert split_servers(["::127.0.0.53", "1.1.1.1"]) == (["1.1.1.1"], ["::127.0.0.53"])
    with pytest.raises(ValueError):
        split_servers(["dns.example"])


def test_run_feeds_stdin_and_captures_both_streams() -> None:
    data = b"x" * 300_000  # larger than a pipe buffer, both ways
    result = run(["cat"], stdin=data)
    assert result.ok and result.stdout == data and result.stderr == b""
    result = run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.returncode, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    with pytest.raises(CommandError, match="exited with 3: err"):
        run(["sh", "-c", "echo err >&2; exit 3"], check=True)
    with pytest.raises(FileNotFoundError):
        run(["no-such-program-here"])
