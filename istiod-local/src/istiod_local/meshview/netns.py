"""Sockets made inside another network namespace, and kept-alive HTTP over them.

A socket belongs to the namespace it was created in, whatever thread uses it
later, and `setns(2)` with CLONE_NEWNET moves only the calling thread. So the
connecting thread steps into the pod's namespace, connects, and steps back
(`connect_in`); the connection then serves request after request with no
process started per sample. Python 3.11 has no `os.setns`: libc's is called
through ctypes there. Needs CAP_SYS_ADMIN (root) for a namespace other than
one's own.
"""

from __future__ import annotations

import ctypes
import http.client
import os
import socket
from collections.abc import Callable
from typing import TypeVar

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/var/run/netns"

T = TypeVar("T")
_libc: ctypes.CDLL | None = None


def netns_path(netns: str) -> str:
    """An `ip netns` name to its file; a path is kept."""
    return netns if netns.startswith("/") else f"{NETNS_DIR}/{netns}"


def _setns(fd: int) -> None:
    setns = getattr(os, "setns", None)
    if setns is not None:
        setns(fd, CLONE_NEWNET)
        return
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def run_in_netns(netns: str | None, action: Callable[[], T]) -> T:
    """Run `action` on this thread inside `netns` (None: where it is), then come back."""
    if netns is None:
        return action()
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(netns_path(netns), os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            return action()
        finally:
            _setns(own)  # an error here would leave the thread elsewhere: let it propagate loudly
    finally:
        os.close(own)


def connect_in(netns: str | None, host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to host:port made from inside `netns`."""
    return run_in_netns(netns, lambda: socket.create_connection((host, port), timeout))


class NetnsHTTPConnection(http.client.HTTPConnection):
    """`http.client.HTTPConnection` whose socket is made in `netns`; HTTP/1.1 keep-alive as usual."""

    def __init__(self, netns: str | None, host: str, port: int, timeout: float = 2.0) -> None:
        super().__init__(host, port, timeout=timeout)
        self.netns = netns

    def connect(self) -> None:
        self.sock = connect_in(self.netns, self.host, self.port, self.timeout or 2.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class HttpGetter:
    """GETs over one kept-alive connection, reconnecting once when the server closed it."""

    def __init__(self, netns: str | None, host: str, port: int, timeout: float = 2.0) -> None:
        self._connection = NetnsHTTPConnection(netns, host, port, timeout)

    def get(self, path: str) -> tuple[int, bytes]:
        for attempt in (0, 1):
            try:
                self._connection.request("GET", path)
                response = self._connection.getresponse()
                body = response.read()
                if response.will_close:
                    self._connection.close()
                return response.status, body
            except (http.client.HTTPException, ConnectionError, TimeoutError, OSError):
                self._connection.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._connection.close()
