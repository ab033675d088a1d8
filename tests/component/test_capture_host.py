"""Capture's host edges against the real thing: the netlink address dump against `ip addr`, and
`procs.run` driving real processes (pipes larger than a pipe buffer, both streams, exit codes, a
program started from a path found earlier)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from needs import need_tool

from istio_agent.capture.addr import format_addr
from istio_agent.capture.apply import Tools
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


def test_run_from_a_known_path_keeps_argv_and_searches_again_when_it_is_gone(tmp_path: Path) -> None:
    script = tmp_path / "named-tool"
    script.write_text('#!/bin/sh\necho "$0 $*"\n')
    script.chmod(0o755)
    assert run(["named-tool", "a"], executable=str(script)).stdout == f"{script} a\n".encode()  # started from there
    shell = run(["renamed-shell", "-c", "cat /proc/$$/cmdline"], executable="/bin/sh")
    assert shell.stdout.startswith(b"renamed-shell\x00-c\x00")  # argv[0] as given, not the path
    gone = str(tmp_path / "moved-away")
    result = run(["sh", "-c", 'echo "$0"', "found-again"], executable=gone)
    assert result.ok and result.stdout == b"found-again\n"  # `sh` from $PATH after the remembered one vanished
    with pytest.raises(FileNotFoundError, match="no-such-program-here: command not found"):
        run(["no-such-program-here"], executable=gone)


def test_tools_run_their_binaries_from_where_they_were_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`Tools.available()` records each binary's path; `Tools.run` spawns from it, with the name as argv[0]."""
    for name in ("iptables-nft", "iptables-nft-save", "iptables-nft-restore"):
        tool = tmp_path / name
        tool.write_text('#!/bin/sh\necho "${0##*/} $*"\n')
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    tools = Tools("nft", False)
    assert tools.available() and tools.paths["iptables-nft-save"] == str(tmp_path / "iptables-nft-save")
    monkeypatch.setenv("PATH", "/nonexistent")  # the remembered paths are used, not a new search
    result = tools.run([tools.save, "-t", "nat"])
    assert result.stdout == b"iptables-nft-save -t nat\n" and result.argv[0] == "iptables-nft-save"
