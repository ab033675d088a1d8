"""The public SDS socket: learn who connected, then hand the bytes to the gRPC server unchanged.

grpc.aio does not tell a handler the credentials of a Unix-socket peer, and the
SDS server needs them (a `file-cert:`/`file-root:` file is served only to a
caller that could read it itself). So the socket Envoy dials (mode 0666) is
served by this relay, not by gRPC:
- on accept it reads the caller's credentials from the kernel (SO_PEERCRED,
  SO_PEERGROUPS: fixed at connect time, no pid race);
- it connects to the real gRPC server on a private socket, inside a 0700
  directory beside the public one, from a socket bound to a fresh random
  abstract name; gRPC reports that name as the stream's `context.peer()`
  (`unix-abstract:istio-sds-<128 random bits>`), which `caller()` maps back to
  the credentials read on accept, for as long as the connection lives;
- then it splices bytes both ways, with backpressure, until either side closes.
A connection made to the private socket directly (only the agent's uid can reach
that directory) has no such name and is refused by the SDS server.

Cost: per connection (Envoy keeps one for all its SDS streams) two getsockopt
calls, one extra socket and connect; per message one extra copy through this
process. SDS traffic is a few KiB per certificate rotation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import cast

from istio_agent.security.peercred import PeerCredentials, read_peer_credentials

log = logging.getLogger(__name__)

ABSTRACT_PREFIX = "istio-sds-"
GRPC_PEER_PREFIX = "unix-abstract:"
PRIVATE_DIR_MODE = 0o700
# sun_path holds 108 bytes including the terminating NUL.
MAX_UDS_PATH = 107
LISTEN_BACKLOG = 128


@contextlib.contextmanager
def reachable_path(path: Path) -> Iterator[str]:
    """`path` as a socket address, even when it is longer than a socket address allows.

    Pods' working directories can be deep; a long path is reached through an open
    descriptor of its directory (`/proc/self/fd/N/<name>`), which the kernel
    resolves at bind/connect time. The descriptor is only needed until then.
    """
    if len(os.fsencode(str(path))) <= MAX_UDS_PATH:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def make_private_dir(directory: Path) -> None:
    """A fresh 0700 directory for the gRPC server's socket (a stale one from a crashed agent is replaced)."""
    if directory.is_symlink() or (directory.exists() and not directory.is_dir()):
        directory.unlink()
    elif directory.is_dir():
        shutil.rmtree(directory)
    directory.mkdir(mode=PRIVATE_DIR_MODE)
    os.chmod(directory, PRIVATE_DIR_MODE)


class _Splice(asyncio.Protocol):
    """One direction's receiving end: what arrives is written to the other side, with flow control."""

    def __init__(self, on_closed: asyncio.Future[None]) -> None:
        self.transport: asyncio.Transport | None = None
        self.other: _Splice | None = None
        self._early: list[bytes] = []  # arrived before the other side was connected
        self._on_closed = on_closed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        if self.other is not None and self.other._early:
            for data in self.other._early:
                self.transport.write(data)
            self.other._early.clear()

    def data_received(self, data: bytes) -> None:
        other = self.other.transport if self.other is not None else None
        if other is None:
            self._early.append(data)
        else:
            other.write(data)

    def eof_received(self) -> bool:
        return False  # close this side; connection_lost closes the other (after flushing what it holds)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.close()
        if not self._on_closed.done():
            self._on_closed.set_result(None)

    def pause_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.resume_reading()


class PeerRelay:
    """Accepts on `public`, splices each connection to the gRPC server at `private`, remembers who is who."""

    def __init__(self, public: Path, private: Path, socket_mode: int) -> None:
        self.public = public
        self.private = private
        self._socket_mode = socket_mode
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._callers: dict[str, PeerCredentials] = {}
        self._private_dir_fd: int | None = None

    @property
    def connection_count(self) -> int:
        return len(self._callers)

    def caller(self, grpc_peer: str) -> PeerCredentials | None:
        """The credentials of the client behind the gRPC peer name, None when it did not come through here."""
        return self._callers.get(grpc_peer)

    async def start(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with reachable_path(self.public) as address:
                listener.bind(address)
            os.chmod(self.public, self._socket_mode)
            listener.listen(LISTEN_BACKLOG)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self._private_dir_fd = os.open(self.private.parent, os.O_RDONLY | os.O_DIRECTORY)
        self._accepting = asyncio.get_running_loop().create_task(self._accept_loop(), name="sds-relay-accept")

    async def stop(self) -> None:
        accepting, self._accepting = self._accepting, None
        if accepting is not None:
            accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await accepting
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._private_dir_fd is not None:
            os.close(self._private_dir_fd)
            self._private_dir_fd = None

    def _private_address(self) -> str:
        if len(os.fsencode(str(self.private))) <= MAX_UDS_PATH or self._private_dir_fd is None:
            return str(self.private)
        return f"/proc/self/fd/{self._private_dir_fd}/{self.private.name}"

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listener is not None
        while True:
            try:
                conn, _ = await loop.sock_accept(self._listener)
            except OSError as exc:  # e.g. EMFILE: keep serving the connections there are
                log.warning("SDS socket: accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(self._relay(conn), name="sds-relay")
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    async def _relay(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        upstream: socket.socket | None = None
        key = ""
        conn_owned = False  # by its transport, which closes it
        transports: list[asyncio.BaseTransport] = []
        try:
            try:
                caller = read_peer_credentials(conn)
            except OSError as exc:
                log.debug("SDS socket: peer gone before its credentials were read: %s", exc)
                return
            name = ABSTRACT_PREFIX + secrets.token_hex(16)
            key = GRPC_PEER_PREFIX + name
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.setblocking(False)
            upstream.bind("\0" + name)
            self._callers[key] = caller
            await loop.sock_connect(upstream, self._private_address())
            closed: asyncio.Future[None] = loop.create_future()
            client_side, server_side = _Splice(closed), _Splice(closed)
            client_side.other, server_side.other = server_side, client_side
            server_transport, _ = await loop.create_unix_connection(lambda: server_side, sock=upstream)
            transports.append(server_transport)
            upstream = None  # owned by its transport now
            client_transport, _ = await loop.connect_accepted_socket(lambda: client_side, sock=conn)
            conn_owned = True
            transports.append(client_transport)
            log.debug("SDS socket: %s connected", caller.describe())
            await closed
        except OSError as exc:
            log.warning("SDS socket: cannot relay a connection to the SDS server: %s", exc)
        finally:
            if key:
                self._callers.pop(key, None)
            for transport in transports:
                transport.close()
            if upstream is not None:
                upstream.close()
            if not conn_owned:
                conn.close()
