"""Which process on the node holds a pod's network namespace, from what the host's procfs says (sans-IO: file
contents in, decisions out; `podnetns.py` reads the files).

In-place repair must enter the network namespace of a pod that is already running. Kubernetes does not say
where that namespace is (runtimes bind-mount it in different places, or not at all), but every pod has a
process in it (its sandbox's pause process, for as long as the pod exists), and procfs shows each process's
namespace: `/proc/<pid>/net/` describes the network namespace of process `<pid>`, so the pod's namespace is
the one whose addresses include the pod's IP. Reading `net/fib_trie` (IPv4: its `/32 host LOCAL` entries are
the namespace's own addresses) or `net/if_inet6` (IPv6) needs no entering of any namespace.

Several processes share a namespace (the pause process, the containers); as upstream does, the oldest one is
chosen, the pause process, which lives as long as the pod (a crash-looping init container comes and goes).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass


def fib_trie_local_addresses(text: str) -> set[str]:
    """The IPv4 addresses a namespace owns: the leaves of `net/fib_trie` with a `/32 host LOCAL` entry."""
    found: set[str] = set()
    leaf = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("|--"):
            leaf = stripped[3:].strip()
        elif stripped.startswith("+--"):
            leaf = ""
        elif leaf and stripped.startswith("/32 ") and stripped.split()[-1] == "LOCAL":
            found.add(leaf)
    return found


def if_inet6_addresses(text: str) -> set[str]:
    """The IPv6 addresses of `net/if_inet6` (32 hex digits per line, then index, prefix, scope, flags, name)."""
    found: set[str] = set()
    for line in text.splitlines():
        fields = line.split()
        if not fields or len(fields[0]) != 32:
            continue
        try:
            found.add(str(ipaddress.IPv6Address(int(fields[0], 16))))
        except ValueError:
            continue
    return found


def net_file_for(pod_ip: str) -> str:
    """The file under `/proc/<pid>/net/` listing addresses of the pod IP's family (ValueError: not an IP)."""
    return "if_inet6" if ipaddress.ip_address(pod_ip).version == 6 else "fib_trie"


def holds_address(net_file: str, text: str, pod_ip: str) -> bool:
    """Whether the namespace whose `net_file` reads `text` owns `pod_ip`."""
    wanted = str(ipaddress.ip_address(pod_ip))
    addresses = if_inet6_addresses(text) if net_file == "if_inet6" else fib_trie_local_addresses(text)
    return wanted in addresses


def start_time(stat: str) -> int | None:
    """Field 22 of `/proc/<pid>/stat` (clock ticks after boot the process started), or None if unreadable.

    The command name (field 2) is in parentheses and may hold spaces and parentheses itself: the fields
    are counted after its last `)`.
    """
    _, closing, rest = stat.rpartition(")")
    fields = rest.split()
    if not closing or len(fields) < 20:
        return None
    try:
        return int(fields[19])
    except ValueError:
        return None


@dataclass(frozen=True)
class Holder:
    """A process in the pod's namespace, and when it started (None: unknown)."""

    pid: int
    started: int | None


def oldest(holders: Iterable[Holder]) -> Holder | None:
    """The process to enter the namespace through: the oldest (the pause process); an unknown start time comes
    last, and equal times go to the lower pid."""
    ranked = sorted(holders, key=lambda h: (h.started is None, h.started or 0, h.pid))
    return ranked[0] if ranked else None
