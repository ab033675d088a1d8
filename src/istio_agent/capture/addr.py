"""IP addresses and CIDR prefixes, parsed with Go `net/netip` rules.

Upstream parses outbound ranges with `netip.ParsePrefix` and writes them into
rules with `Prefix.String()`, and prints resolv.conf servers with
`Addr.String()`. Our rules must carry the same text, so this module
reproduces that canonical form: lower-case hex, the first longest run of two
or more zero groups compressed, dotted quad only for IPv4-mapped addresses,
and the prefix address kept as written (not masked).

It uses `_socket.inet_pton` instead of `ipaddress` on purpose: this code is on
the `istio-iptables` start-up path, where every imported module costs time.
"""

from __future__ import annotations

import _socket

_V4_LOOPBACK_FIRST_OCTET = 127
_V6_LOOPBACK = bytes(15) + b"\x01"
_V4_MAPPED_PREFIX = bytes(10) + b"\xff\xff"


class Prefix:
    """A parsed `addr/bits` prefix; `text` is its canonical (Go) spelling."""

    __slots__ = ("bits", "is_v4", "packed")

    def __init__(self, packed: bytes, bits: int) -> None:
        self.packed = packed
        self.bits = bits
        self.is_v4 = len(packed) == 4

    @property
    def text(self) -> str:
        return f"{format_addr(self.packed)}/{self.bits}"

    @property
    def is_loopback(self) -> bool:
        return is_loopback(self.packed)

    def __repr__(self) -> str:
        return f"Prefix({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Prefix) and (self.packed, self.bits) == (other.packed, other.bits)

    def __hash__(self) -> int:
        return hash((self.packed, self.bits))


def parse_addr(text: str) -> bytes:
    """Return the packed address (4 or 16 bytes); ValueError when `text` is not an IP.

    Like Go, leading zeros in IPv4 octets are refused (glibc's inet_pton does
    the same). Zones (`fe80::1%eth0`) are refused: they cannot appear in a rule.
    """
    if not text or "%" in text or text.strip() != text:
        raise ValueError(f"{text!r} is not an IP address")
    try:
        return _socket.inet_pton(_socket.AF_INET, text)
    except OSError:
        pass
    try:
        return _socket.inet_pton(_socket.AF_INET6, text)
    except OSError:
        raise ValueError(f"{text!r} is not an IP address") from None


def parse_prefix(text: str) -> Prefix:
    """Parse `addr/bits` strictly (a bare address is an error, as in Go)."""
    addr, sep, bits_text = text.rpartition("/")
    if not sep:
        raise ValueError(f"{text!r} is not a CIDR range (missing /bits)")
    packed = parse_addr(addr)
    limit = 8 * len(packed)
    if not bits_text.isdigit() or not bits_text.isascii() or (len(bits_text) > 1 and bits_text[0] == "0"):
        raise ValueError(f"{text!r} has an invalid prefix length")
    bits = int(bits_text)
    if bits > limit:
        raise ValueError(f"{text!r} has a prefix length above {limit}")
    return Prefix(packed, bits)


def is_loopback(packed: bytes) -> bool:
    """Go's `Addr.IsLoopback`, including IPv4-mapped 127/8."""
    if len(packed) == 16 and packed[:12] == _V4_MAPPED_PREFIX:
        packed = packed[12:]
    if len(packed) == 4:
        return packed[0] == _V4_LOOPBACK_FIRST_OCTET
    return packed == _V6_LOOPBACK


def is_link_local(packed: bytes) -> bool:
    """Link-local unicast or link-local multicast, as `getLocalIP` skips them."""
    if len(packed) == 16 and packed[:12] == _V4_MAPPED_PREFIX:
        packed = packed[12:]
    if len(packed) == 4:
        return packed[:2] == b"\xa9\xfe" or packed[:3] == b"\xe0\x00\x00"
    return (packed[0] == 0xFE and packed[1] & 0xC0 == 0x80) or packed[:2] == b"\xff\x02"


def format_addr(packed: bytes) -> str:
    """Canonical text of a packed address, exactly as Go's `netip.Addr.String`."""
    if len(packed) == 4:
        return ".".join(str(b) for b in packed)
    if packed[:12] == _V4_MAPPED_PREFIX:
        return "::ffff:" + ".".join(str(b) for b in packed[12:])
    groups = [(packed[i] << 8) | packed[i + 1] for i in range(0, 16, 2)]
    best_start, best_len = -1, 0
    i = 0
    while i < 8:
        if groups[i] == 0:
            j = i
            while j < 8 and groups[j] == 0:
                j += 1
            if j - i >= 2 and j - i > best_len:
                best_start, best_len = i, j - i
            i = j
        else:
            i += 1
    if best_start < 0:
        return ":".join(f"{g:x}" for g in groups)
    head = ":".join(f"{g:x}" for g in groups[:best_start])
    tail = ":".join(f"{g:x}" for g in groups[best_start + best_len :])
    return f"{head}::{tail}"
