"""The host's neighbour (ARP) table must hold every pod's view of its peers: raise its limits when too low.

Pods on the node's bridge reach each other directly on one L2 segment, so
each pod namespace keeps an ARP entry per peer it talks to, and the node
namespace one per pod. The kernel's IPv4 neighbour table is a single table
for all network namespaces: `net.ipv4.neigh.default.gc_thresh3` (1024 by
default) caps the entries of every namespace together. Measured: 81 pods of
the default mesh at `--scale 9` filled it (1024 entries across 84
namespaces, "neighbour: arp_cache: neighbor table overflow!" in the kernel
log), after which new ARP resolutions failed, SYNs were dropped and a third
of `--check`'s probes timed out.

A Kubernetes node running that many pods raises the same limits in its node
configuration; the local node does it when it is created: enough for every
address of its pod CIDR to hold an entry for every other, twice over (a
second node may run beside it), rounded up to a power of two. It only
raises, never lowers, and leaves the values as they are on close: other
nodes, of this process or another, may rely on them, and a larger limit
costs memory only for entries that exist.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

SYSCTL_DIR = Path("/proc/sys/net/ipv4/neigh/default")
SOFT, HARD = "gc_thresh2", "gc_thresh3"  # the soft limit (GC of entries older than 5 s) and the hard cap


def wanted_limits(pod_addresses: int, current: Mapping[str, int]) -> dict[str, int]:
    """The limits to write (only those to raise) for a node with `pod_addresses` usable pod addresses."""
    need = 2 * pod_addresses * (pod_addresses + 1)
    hard = 1 << max(need - 1, 1).bit_length()
    wanted = {HARD: hard, SOFT: hard // 2}
    return {name: value for name, value in wanted.items() if current.get(name, 0) < value}


def read_limits(directory: Path = SYSCTL_DIR) -> dict[str, int]:
    out = {}
    for name in (SOFT, HARD):
        try:
            out[name] = int((directory / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return out


def raise_limits(pod_addresses: int, directory: Path = SYSCTL_DIR) -> dict[str, int]:
    """Raise the host's neighbour-table limits for the pods; what was written (empty when nothing was needed
    or the values cannot be written here: a node still works, only with fewer pods talking to each other)."""
    written = {}
    for name, value in wanted_limits(pod_addresses, read_limits(directory)).items():
        try:
            (directory / name).write_text(f"{value}\n")
        except OSError:
            continue
        written[name] = value
    return written
