"""Enter a network namespace (`--network-namespace /var/run/netns/x` or `/proc/<pid>/ns/net`).

The whole process moves: every later socket (the validation probe) and every
child (`iptables-restore`, `nft`, `ip`) then lives in the target namespace, so
no `nsenter` wrapper is needed per command. Python 3.12 has `os.setns` (`posix.setns`); on
3.11 libc's `setns(2)` is called through `istio_agent.libc` (the `_ctypes` extension, imported only then).
"""

from __future__ import annotations

import posix  # not `os`: see procs.py (under `python -S` nothing else imports it)

CLONE_NEWNET = 0x40000000


def enter_netns(path: str) -> None:
    """Switch this process into the network namespace at `path` (OSError on failure)."""
    fd = posix.open(path, posix.O_RDONLY | posix.O_CLOEXEC)
    try:
        setns = getattr(posix, "setns", None)
        if setns is not None:
            setns(fd, CLONE_NEWNET)
            return
        from istio_agent import libc  # `_ctypes` directly: the `ctypes` package costs ~2.5 ms to import

        if libc.call(libc.function("setns"), fd, CLONE_NEWNET) != 0:
            raise OSError(f"setns({path}) failed: not a network namespace, or not permitted")
    finally:
        posix.close(fd)
