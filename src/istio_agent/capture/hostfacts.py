"""Facts upstream reads from the machine: IPv6 on/off, DNS servers, the proxy uid.

Each can be pinned instead (`--enable-ipv6`, `--dns-servers`, `-u`), which is
how dry runs are made reproducible. Detection follows upstream:

- IPv6: the first non-loopback, non-link-local address, walking interfaces in
  index order (what Go's `net.InterfaceAddrs` returns); with dual stack, any
  such IPv6 address. No such address at all is an error, as upstream.
- DNS: `nameserver` lines of /etc/resolv.conf, split by family, printed in
  canonical form (so `::127.0.0.53` reads back as `::7f00:35`).
- Proxy uid: the uid of `$ENVOY_USER` (default `istio-proxy`), else 1337.

Addresses come from one rtnetlink dump on a raw socket: no `ip` process and
no heavy imports on the start-up path (netlink's integers are read with
`int.from_bytes`: `struct` would be two more modules for every pod).
"""

from __future__ import annotations

import _socket
import sys

from istio_agent.capture.addr import format_addr, is_link_local, is_loopback, parse_addr

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

_RTM_GETADDR = 22
_RTM_NEWADDR = 20
_NLMSG_DONE = 3
_NLMSG_ERROR = 2
_NLM_F_REQUEST = 0x1
_NLM_F_DUMP = 0x300
_IFA_ADDRESS = 1
_IFA_LOCAL = 2


_ORDER = sys.byteorder  # netlink's integers are in the host's byte order


class HostFactError(RuntimeError):
    """A host fact could not be determined."""


def netlink_int(data: bytes, offset: int, size: int) -> int:
    """The unsigned integer of `size` bytes at `offset` of a netlink message."""
    return int.from_bytes(data[offset : offset + size], _ORDER)


def netlink_dump_request(msg_type: int, body: bytes) -> bytes:
    """A dump request: nlmsghdr (length, type, NLM_F_REQUEST | NLM_F_DUMP, sequence 1, port 0), then `body`."""
    flags = _NLM_F_REQUEST | _NLM_F_DUMP
    return ((16 + len(body)).to_bytes(4, _ORDER) + msg_type.to_bytes(2, _ORDER) + flags.to_bytes(2, _ORDER)
            + (1).to_bytes(4, _ORDER) + bytes(4) + body)


def interface_addresses() -> list[tuple[int, bytes]]:
    """(ifindex, packed address) for every address in this network namespace, kernel dump order."""
    sock = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_RAW, 0)
    try:
        sock.bind((0, 0))
        sock.sendto(netlink_dump_request(_RTM_GETADDR, bytes([_socket.AF_UNSPEC, 0, 0, 0]) + bytes(4)), (0, 0))
        found: list[tuple[int, bytes]] = []
        while True:
            data = sock.recv(65536)
            offset = 0
            while offset + 16 <= len(data):
                length, kind = netlink_int(data, offset, 4), netlink_int(data, offset + 4, 2)
                if length < 16:
                    return found
                if kind == _NLMSG_DONE:
                    return found
                if kind == _NLMSG_ERROR:
                    raise HostFactError("netlink address dump failed")
                if kind == _RTM_NEWADDR:
                    found.extend(_parse_ifaddr(data[offset + 16 : offset + length]))
                offset += (length + 3) & ~3
    finally:
        sock.close()


def _parse_ifaddr(body: bytes) -> list[tuple[int, bytes]]:
    if len(body) < 8:  # struct ifaddrmsg: family, prefix length, flags, scope, interface index
        return []
    family, index = body[0], netlink_int(body, 4, 4)
    attrs: dict[int, bytes] = {}
    offset = 8
    while offset + 4 <= len(body):
        rta_len, rta_type = netlink_int(body, offset, 2), netlink_int(body, offset + 2, 2)
        if rta_len < 4:
            break
        attrs[rta_type] = body[offset + 4 : offset + rta_len]
        offset += (rta_len + 3) & ~3
    addr = attrs.get(_IFA_LOCAL) or attrs.get(_IFA_ADDRESS)
    if addr is None or (family, len(addr)) not in ((_socket.AF_INET, 4), (_socket.AF_INET6, 16)):
        return []
    return [(index, addr)]


_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8


def interface_flags(name: str) -> int:
    """The interface's flags (IFF_*), from sysfs; 0 when it cannot be read."""
    try:
        with open(f"/sys/class/net/{name}/flags", encoding="ascii") as handle:
            return int(handle.read().strip(), 16)
    except (OSError, ValueError):
        return 0


def up_interface_addresses() -> list[tuple[str, str]]:
    """(interface name, address) for every address on an interface that is up and not loopback.

    In Go's `net.Interfaces()` order (by index), each interface's addresses in dump
    order: what upstream's GetPrivateIPs walks before filtering the addresses.
    """
    names = dict(_socket.if_nameindex())
    found: list[tuple[int, str, str]] = []
    for index, packed in interface_addresses():
        name = names.get(index, "")
        flags = interface_flags(name) if name else 0
        if flags & _IFF_UP and not flags & _IFF_LOOPBACK:
            found.append((index, format_addr(packed), name))
    found.sort(key=lambda item: item[0])  # a stable sort keeps dump order within an interface
    return [(name, address) for _, address, name in found]


def ipv6_from_addresses(addresses: list[tuple[int, bytes]], dual_stack: bool) -> bool:
    """Upstream's getLocalIP decision, over (ifindex, address) pairs."""
    usable = [a for _, a in sorted(addresses, key=lambda pair: pair[0]) if not is_loopback(a) and not is_link_local(a)]
    if not usable:
        raise HostFactError("no valid local IP address found (pin it with --enable-ipv6=true|false)")
    if not dual_stack:
        return len(usable[0]) == 16
    return any(len(a) == 16 for a in usable)


def detect_ipv6(dual_stack: bool) -> bool:
    return ipv6_from_addresses(interface_addresses(), dual_stack)


def parse_resolv_conf(text: str) -> tuple[list[str], list[str]]:
    """IPv4 and IPv6 nameservers, canonical text; anything that is not an IP is skipped. An IPv6 address may
    carry a zone (`fe80::1%eth0`), kept after the canonical address, as Go's netip.ParseAddr reads it."""
    v4: list[str] = []
    v6: list[str] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 2 or fields[0] != "nameserver":
            continue
        address, percent, zone = fields[1].partition("%")
        try:
            packed = parse_addr(address)
        except ValueError:
            continue
        if percent and (len(packed) == 4 or not zone):
            continue  # a zone only on IPv6, and never empty
        (v4 if len(packed) == 4 else v6).append(format_addr(packed) + percent + zone)
    return v4, v6


def read_dns_servers(path: str = "/etc/resolv.conf") -> tuple[list[str], list[str]]:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return parse_resolv_conf(handle.read())
    except OSError as err:
        raise HostFactError(f"failed to load {path}: {err}") from None


def default_proxy_uid(env: Mapping[str, str]) -> str:
    """The uid of $ENVOY_USER (default istio-proxy), or 1337 when there is no such user."""
    import pwd

    try:
        return str(pwd.getpwnam(env.get("ENVOY_USER", "istio-proxy")).pw_uid)
    except KeyError:
        return "1337"


def split_servers(servers: list[str]) -> tuple[list[str], list[str]]:
    """Split a pinned server list by family, keeping each entry's text verbatim."""
    v4: list[str] = []
    v6: list[str] = []
    for server in servers:
        (v4 if len(parse_addr(server)) == 4 else v6).append(server)
    return v4, v6
