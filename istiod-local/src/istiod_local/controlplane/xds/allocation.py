"""Stable virtual IPs: clusterIPs for services and auto-allocated VIPs for service entries.

A service without a `clusterIP` must keep the same address every time the
registry is reloaded, or every reload would rewrite listeners and DNS
answers across the mesh. Addresses are therefore chosen by hashing the
object's key (FNV-1a, as upstream does for service entries) into the pool,
with double hashing on collisions. Keys are placed in sorted order, so the
result depends only on the set of keys and the addresses already taken, not
on the order of the file; a key keeps its address across edits unless a
collision moves it.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable

SERVICE_CIDR = "10.96.0.0/16"
AUTO_ALLOCATE_CIDR = "240.240.0.0/16"

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


def fnv1a32(data: bytes) -> int:
    value = _FNV_OFFSET
    for byte in data:
        value ^= byte
        value = (value * _FNV_PRIME) & 0xFFFFFFFF
    return value


def _usable(network: ipaddress.IPv4Network, skip_edge_octets: bool) -> list[int]:
    """Addresses a VIP may take, as integers: no network/broadcast address, and (for auto VIPs) no .0/.255."""
    first, last = int(network.network_address) + 1, int(network.broadcast_address) - 1
    if skip_edge_octets:
        return [a for a in range(first, last + 1) if a & 0xFF not in (0, 255)]
    return list(range(first, last + 1))


_POOLS: dict[tuple[str, bool], list[int]] = {}


def _pool(cidr: str, skip_edge_octets: bool) -> list[int]:
    key = (cidr, skip_edge_octets)
    if key not in _POOLS:
        _POOLS[key] = _usable(ipaddress.IPv4Network(cidr), skip_edge_octets)
    return _POOLS[key]


@functools.cache
def _largest_prime(below: int) -> int:
    for candidate in range(below - 1, 1, -1):
        if all(candidate % d for d in range(2, int(candidate**0.5) + 1)):
            return candidate
    return 2


def allocate(
    keys: Iterable[str],
    cidr: str,
    taken: Iterable[str] = (),
    reserved: Iterable[str] = (),
    skip_edge_octets: bool = False,
) -> dict[str, str]:
    """Give every key an address from `cidr` that is neither taken nor reserved.

    Raises ValueError when the pool is exhausted.
    """
    wanted = sorted(set(keys))
    if not wanted:
        return {}
    pool = _pool(cidr, skip_edge_octets)
    size = len(pool)
    step_prime = _largest_prime(size)
    used = {str(a) for a in taken} | {str(a) for a in reserved}
    out: dict[str, str] = {}
    for key in wanted:
        digest = fnv1a32(key.encode())
        slot = digest % size
        step = step_prime - (digest % step_prime)
        for _ in range(size):
            candidate = str(ipaddress.IPv4Address(pool[slot]))
            if candidate not in used:
                break
            slot = (slot + step) % size
        else:
            raise ValueError(f"no free address left in {cidr} for {key}")
        used.add(candidate)
        out[key] = candidate
    return out


def allocate_cluster_ips(keys: Iterable[str], taken: Iterable[str]) -> dict[str, str]:
    """clusterIPs from 10.96.0.0/16; 10.96.0.1 and 10.96.0.10 stay free (kubernetes and kube-dns by convention)."""
    return allocate(keys, SERVICE_CIDR, taken, reserved=("10.96.0.1", "10.96.0.10"))


def allocate_auto_vips(keys: Iterable[str], taken: Iterable[str] = ()) -> dict[str, str]:
    """Service-entry VIPs from 240.240.0.0/16 (never x.x.x.0 or x.x.x.255), as upstream's auto-allocation."""
    return allocate(keys, AUTO_ALLOCATE_CIDR, taken, skip_edge_octets=True)
