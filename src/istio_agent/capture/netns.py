"""Enter a network namespace (`--network-namespace /var/run/netns/x` or `/proc/<pid>/ns/net`).

The whole process moves: every later socket (the validation probe) and every
child (`iptables-restore`, `nft`, `ip`) then lives in the target namespace, so
no `nsenter` wrapper is needed per command. Python 3.12 has `os.setns`; on
3.11 libc's `setns(2)` is called through ctypes, imported only here.
"""

from __future__ import annotations

import os

CLONE_NEWNET = 0x40000000


def enter_netns(path: str) -> None:
    """Switch this process into the network namespace at `path` (OSError on failure)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns = getattr(os, "setns", None)
        if setns is not None:
            setns(fd, CLONE_NEWNET)
            return
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns({path}): {os.strerror(errno)}")
    finally:
        os.close(fd)
