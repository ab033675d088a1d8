"""Which netfilter tables exist in this namespace, asked of the kernel directly.

A brand-new pod namespace has no tables at all; then there can be no rules,
no Istio residue and nothing to compare, and the `iptables-save` probe (a
process of its own) can be skipped. For the nf_tables backend the tables come
from one NFT_MSG_GETTABLE dump over nfnetlink; for the legacy backend from
/proc/thread-self/net/ip{,6}_tables_names, which lists only tables already in use. Any
doubt (an error, an unexpected reply) answers None, and the caller falls back
to `iptables-save`.
"""

from __future__ import annotations

import _socket
import posix  # not `os`: see procs.py

from istio_agent.capture.hostfacts import netlink_dump_request, netlink_int

_NETLINK_NETFILTER = 12
_NFNL_SUBSYS_NFTABLES = 10
_NFT_MSG_GETTABLE = 1
_NFT_MSG_NEWTABLE = 0
_NFTA_TABLE_NAME = 1
_NLMSG_ERROR = 2
_NLMSG_DONE = 3
_NFPROTO_IPV4 = 2
_NFPROTO_IPV6 = 10


def nft_table_names(v6: bool) -> set[str] | None:
    """Names of the nf_tables tables of family ip (or ip6), or None when the kernel cannot say."""
    family = _NFPROTO_IPV6 if v6 else _NFPROTO_IPV4
    kind = (_NFNL_SUBSYS_NFTABLES << 8) | _NFT_MSG_GETTABLE
    request = netlink_dump_request(kind, bytes([family, 0, 0, 0]))  # struct nfgenmsg: family, version, resource id
    try:
        sock = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_RAW, _NETLINK_NETFILTER)
    except OSError:
        return None
    names: set[str] = set()
    try:
        sock.settimeout(2.0)
        sock.bind((0, 0))
        sock.sendto(request, (0, 0))
        while True:
            data = sock.recv(65536)
            offset = 0
            while offset + 16 <= len(data):
                length, msg_type = netlink_int(data, offset, 4), netlink_int(data, offset + 4, 2)
                if length < 16 or msg_type == _NLMSG_ERROR:
                    return None  # a dump ends with NLMSG_DONE; anything else is a refusal
                if msg_type == _NLMSG_DONE:
                    return names
                if msg_type == (_NFNL_SUBSYS_NFTABLES << 8) | _NFT_MSG_NEWTABLE:
                    name = _table_name(data[offset + 20 : offset + length])
                    if name is None:
                        return None
                    names.add(name)
                offset += (length + 3) & ~3
    except OSError:
        return None
    finally:
        sock.close()


def _table_name(attrs: bytes) -> str | None:
    offset = 0
    while offset + 4 <= len(attrs):
        rta_len, rta_type = netlink_int(attrs, offset, 2), netlink_int(attrs, offset + 2, 2)
        if rta_len < 4:
            return None
        if rta_type & 0x3FFF == _NFTA_TABLE_NAME:
            return attrs[offset + 4 : offset + rta_len].split(b"\x00", 1)[0].decode(errors="replace")
        offset += (rta_len + 3) & ~3
    return None


def legacy_table_names(v6: bool) -> set[str] | None:
    """Legacy xtables tables in use in this namespace (instantiated on first use).

    The calling thread's namespace (`/proc/thread-self/net`; `/proc/net` is the
    main thread's): install-cni's fast path applies from a thread that entered the pod's netns.
    Read with `posix` (a path lookup under /proc costs ~30 us here: /proc/thread-self itself is
    looked at only when the file is missing, to tell a kernel before 3.17 from one without legacy tables).
    """
    name = "ip6_tables_names" if v6 else "ip_tables_names"
    try:
        return _read_names(f"/proc/thread-self/net/{name}")
    except FileNotFoundError:
        pass
    except OSError:
        return None
    try:
        posix.stat("/proc/thread-self")
    except OSError:  # kernels before 3.17
        try:
            return _read_names(f"/proc/net/{name}")
        except FileNotFoundError:
            return set()
        except OSError:
            return None
    return set()  # no legacy xtables support at all: certainly no legacy tables


def _read_names(path: str) -> set[str]:
    """The whitespace-separated names in a /proc file (read to its end)."""
    fd = posix.open(path, posix.O_RDONLY | posix.O_CLOEXEC)
    try:
        chunks: list[bytes] = []
        while chunk := posix.read(fd, 65536):
            chunks.append(chunk)
    finally:
        posix.close(fd)
    return {item.decode(errors="replace") for item in b"".join(chunks).split()}
