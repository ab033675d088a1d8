"""In-place repair's way to a pod's network namespace: procfs' address lists and process start times read
(`procnet`), and the scan of a proc directory (`podnetns`) over a tree laid out as procfs is, where a
namespace's identity is its `ns/net` file's device and inode (hard links share one, as processes in one
namespace do)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from istio_agent.cni.repair.podnetns import NetnsNotFound, find_pod_netns
from istio_agent.cni.repair.procnet import (
    Holder,
    fib_trie_local_addresses,
    holds_address,
    if_inet6_addresses,
    net_file_for,
    oldest,
    start_time,
)

# `net/fib_trie` of a pod namespace (eth0 10.77.0.5/24, lo), as this kernel writes it.
FIB_TRIE = """\
Main:
  +-- 0.0.0.0/1 2 0 2
     +-- 10.77.0.0/24 2 0 2
        +-- 10.77.0.0/29 2 0 2
           |-- 10.77.0.0
              /24 link UNICAST
           |-- 10.77.0.5
              /32 host LOCAL
        |-- 10.77.0.255
           /32 link BROADCAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
Local:
  +-- 0.0.0.0/1 2 0 2
     +-- 10.77.0.0/24 2 0 2
        +-- 10.77.0.0/29 2 0 2
           |-- 10.77.0.0
              /24 link UNICAST
           |-- 10.77.0.5
              /32 host LOCAL
        |-- 10.77.0.255
           /32 link BROADCAST
"""
IF_INET6 = """\
fe8000000000000060c178fffe1858a7 02 40 20 c0       d1
fd000000000000000000000000000005 03 40 00 82       d0
00000000000000000000000000000001 01 80 10 80       lo
"""
# A pod's sandbox: the command name holds a space and a parenthesis; field 22 (start time) is 4242.
STAT = "1234 (pause (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 4242 1024 100 1 2 3"


def test_the_local_ipv4_addresses_are_the_leaves_with_a_host_local_entry() -> None:
    assert fib_trie_local_addresses(FIB_TRIE) == {"10.77.0.5", "127.0.0.1"}  # not the network, not broadcast
    assert fib_trie_local_addresses("") == set()


def test_ipv6_addresses_are_read_and_written_canonically() -> None:
    assert if_inet6_addresses(IF_INET6) == {"fe80::60c1:78ff:fe18:58a7", "fd00::5", "::1"}
    assert holds_address("if_inet6", IF_INET6, "fd00:0::5") and not holds_address("if_inet6", IF_INET6, "fd00::6")
    assert net_file_for("fd00::5") == "if_inet6" and net_file_for("10.1.2.3") == "fib_trie"
    with pytest.raises(ValueError):
        net_file_for("not-an-ip")


def test_start_time_is_counted_after_the_last_parenthesis() -> None:
    assert start_time(STAT) == 4242
    assert start_time("1234 (short") is None and start_time("") is None


def test_the_oldest_process_is_chosen_unknown_times_last() -> None:
    assert oldest([Holder(30, 500), Holder(10, None), Holder(20, 100), Holder(5, 100)]) == Holder(5, 100)
    assert oldest([Holder(10, None)]) == Holder(10, None)
    assert oldest([]) is None


# ---- the scan


class FakeProc:
    """A directory laid out as procfs: `<pid>/net/fib_trie`, `<pid>/stat`, `<pid>/ns/net` (one file per
    namespace, hard-linked into each of its processes)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.namespaces: dict[str, Path] = {}

    def process(self, pid: int, namespace: str, started: int, fib_trie: str = "") -> None:
        base = self.root / str(pid)
        (base / "net").mkdir(parents=True)
        (base / "ns").mkdir()
        (base / "net" / "fib_trie").write_text(fib_trie)
        (base / "stat").write_text(f"{pid} (proc {pid}) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {started} 1 1")
        first = self.namespaces.setdefault(namespace, base / "ns" / "net")
        if first == base / "ns" / "net":
            first.write_text(namespace)
        else:
            os.link(first, base / "ns" / "net")


def _trie(address: str) -> str:
    return FIB_TRIE.replace("10.77.0.5", address)


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    fake = FakeProc(tmp_path / "proc")
    fake.process(1, "host", 10, _trie("192.168.1.10"))  # the host: never chosen, whatever it holds
    return fake


def test_the_pods_namespace_is_entered_through_its_oldest_process(proc: FakeProc) -> None:
    proc.process(200, "pod-a", 900, _trie("10.244.0.7"))  # istio-validation, restarted
    proc.process(150, "pod-a", 500, _trie("10.244.0.7"))  # the sandbox
    proc.process(300, "pod-b", 100, _trie("10.244.0.8"))
    found = find_pod_netns(str(proc.root), "10.244.0.7")
    assert (found.path, found.pid, found.processes) == (f"{proc.root}/150/ns/net", 150, 2)


def test_the_hosts_namespace_and_the_excluded_one_are_never_chosen(proc: FakeProc) -> None:
    proc.process(400, "host", 20, _trie("192.168.1.10"))  # a host process: PID 1's namespace
    with pytest.raises(NetnsNotFound, match=r"no network namespace holding 192\.168\.1\.10"):
        find_pod_netns(str(proc.root), "192.168.1.10")
    proc.process(500, "agent", 30, _trie("10.244.0.9"))
    info = os.stat(proc.root / "500" / "ns" / "net")
    with pytest.raises(NetnsNotFound):
        find_pod_netns(str(proc.root), "10.244.0.9", exclude=(info.st_dev, info.st_ino))


def test_two_namespaces_holding_the_address_are_refused(proc: FakeProc) -> None:
    proc.process(600, "pod-a", 100, _trie("10.244.0.7"))
    proc.process(700, "stale", 50, _trie("10.244.0.7"))
    with pytest.raises(NetnsNotFound, match=r"2 network namespaces hold 10\.244\.0\.7"):
        find_pod_netns(str(proc.root), "10.244.0.7")


def test_a_missing_proc_directory_says_what_to_mount(tmp_path: Path) -> None:
    with pytest.raises(NetnsNotFound, match="--repair-host-proc-dir"):
        find_pod_netns(str(tmp_path / "absent"), "10.244.0.7")
