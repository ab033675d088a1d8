"""Capture's host edges against the real thing: the netlink address dump against `ip addr`, and
`procs.run` driving real processes (pipes larger than a pipe buffer, both streams, exit codes)."""

from __future__ import annotations

import subprocess

import pytest
from needs import need_tool

from istio_agent.capture.addr import format_addr
from istio_agent.capture.hostfacts import interface_addresses
from istio_agent.capture.procs import CommandError, run


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
