"""Splitting `host:port` addresses, one set of rules for every part of the project.

Addresses arrive from flags, environment variables, ProxyConfig fields and
xDS resource names. They are split as Go's `net.SplitHostPort` splits them
(upstream parses the same strings with it), with the port checked to be a
number a socket can use:

* `host:port`, and `[host]:port` for an IPv6 literal (optionally with a
  `%zone`); an unbracketed host holding a colon is refused, because
  `::1:53` could mean two different things;
* the host may be empty (`:15053` is a listen address for every interface);
* the port is ASCII decimal digits, 0 to 65535.

A plain library: standard library only, so that every CLI may import it.
"""

from __future__ import annotations

import ipaddress

MAX_PORT = 65535


class AddressError(ValueError):
    """An address is not `host:port`; the message names the address and what is wrong with it."""


def split_host_port(address: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` -> (host without brackets, port); AddressError when it is not one."""
    if address.startswith("["):
        end = address.find("]")
        if end < 0:
            raise AddressError(f"address {address!r} has a '[' without a matching ']'")
        host, rest = address[1:end], address[end + 1:]
        if not rest:
            raise AddressError(f"address {address!r} must be host:port")
        if not rest.startswith(":"):
            raise AddressError(f"address {address!r} has text after ']' that is not :port")
        port_text = rest[1:]
    else:
        host, colon, port_text = address.rpartition(":")
        if not colon:
            raise AddressError(f"address {address!r} must be host:port")
        if ":" in host:
            raise AddressError(f"IPv6 address {address!r} must be written [addr]:port")
    if "[" in host or "]" in host or "[" in port_text or "]" in port_text:
        raise AddressError(f"address {address!r} has misplaced brackets")
    if not (port_text.isascii() and port_text.isdigit()):
        raise AddressError(f"address {address!r} has no numeric port")
    port = int(port_text)
    if port > MAX_PORT:
        raise AddressError(f"address {address!r} has port {port} out of range (0-{MAX_PORT})")
    return host, port


def split_host_optional_port(address: str) -> tuple[str, int | None]:
    """A host name with an optional `:port` -> (host, port or None). Never raises.

    When `address` splits by `split_host_port` into a non-empty host and a port,
    that is the answer; otherwise all of it is the host (without the brackets
    of a bracketed `[v6]`) and there is no port. So `greeter`, `::1` and
    `[::1]` carry no port, and neither does `greeter:http`: a name that does not
    end in a usable port is a name, not an error. Used where the text names a
    host first (a CA address, a gRPC target's listener name) and a port only
    if one is there.
    """
    try:
        host, port = split_host_port(address)
    except AddressError:
        pass
    else:
        if host:
            return host, port
    if address.startswith("[") and address.endswith("]") and address.count("[") == 1 and address.count("]") == 1:
        return address[1:-1], None
    return address, None


def join_host_port(host: str, port: int) -> str:
    """`host:port`, with an IPv6 literal bracketed (Go's `net.JoinHostPort`; an already bracketed host stays as is)."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def is_localhost(remote: str | None) -> bool:
    """Whether a peer address (`127.0.0.1`, `::1`, `::ffff:127.0.0.1`, `fe80::1%eth0`...) is this host's loopback."""
    if not remote:
        return False
    try:
        addr = ipaddress.ip_address(remote.split("%")[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback
