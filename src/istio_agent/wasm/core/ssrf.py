"""Which addresses a Wasm fetch may connect to, and which token realms a registry may send it to.

Upstream's guard (pkg/wasm/ssrf.go): the check is made on the address a name resolved to, just before the
connection, for the first request and every redirect alike, so neither a DNS name nor a redirect can lead a
fetch to the node's metadata service. Link-local addresses (169.254.0.0/16, fe80::/10 and the link-local
multicast ranges) and the cloud metadata addresses outside them are always refused;
BLOCKED_CIDRS_IN_WASM_FETCH adds ranges.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_LINK_LOCAL = tuple(ipaddress.ip_network(n) for n in ("169.254.0.0/16", "224.0.0.0/24", "fe80::/10"))
# Metadata services outside the link-local ranges: Alibaba Cloud's (carrier-grade NAT space) and AWS's IPv6 IMDS.
_CLOUD_METADATA = tuple(ipaddress.ip_network(n) for n in ("100.100.100.200/32", "fd00:ec2::/32"))


def _is_link_local(ip: IPAddress) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.packed[0] == 0xFF and ip.packed[1] & 0x0F == 0x02:
        return True  # link-local multicast scope, as Go's IsLinkLocalMulticast
    return any(ip in net for net in _LINK_LOCAL if net.version == ip.version)


def blocked_reason(ip: IPAddress, blocked: Iterable[Network] = ()) -> str | None:
    """Why a fetch must not connect to `ip`, or None when it may."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if _is_link_local(ip):
        return f"connection blocked: resolved IP {ip} is link-local"
    if any(ip in net for net in _CLOUD_METADATA if net.version == ip.version):
        return f"connection blocked: resolved IP {ip} is a known cloud metadata address"
    for net in blocked:
        if net.version == ip.version and ip in net:
            return f"connection blocked: resolved IP {ip} is in blocked CIDR range {net}"
    return None


def parse_cidrs(text: str) -> tuple[tuple[Network, ...], list[str]]:
    """BLOCKED_CIDRS_IN_WASM_FETCH: the ranges, and a warning for each entry that is not one (skipped, as upstream)."""
    ranges: list[Network] = []
    warnings: list[str] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            ranges.append(ipaddress.ip_network(item, strict=False))
        except ValueError as exc:
            warnings.append(f"failed to parse CIDR range {item!r}: {exc}")
    return tuple(ranges), warnings


def realm_problem(realm: str) -> str | None:
    """Why a bearer-token realm from a registry's challenge must not be asked, or None (upstream's realm check).

    The realm is a URL the registry names for the client to get a token from: it could point the agent at the
    node's own services, so it must be HTTP(S) to a public name or address.
    """
    try:
        split = urlsplit(realm)
        host = split.hostname or ""
    except ValueError as exc:
        return f"invalid realm URL: {exc}"
    if split.scheme not in ("http", "https"):
        return f"realm scheme {split.scheme!r} not allowed"
    if not host:
        return "realm missing host"
    if host == "metadata.google.internal":
        return "realm targets cloud metadata service"
    if host == "localhost":
        return "realm targets localhost"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if ip.is_private or ip.is_loopback or ip.is_link_local:
        return "realm targets private/loopback/link-local IP"
    return None
