"""Forwarding unknown names to the resolv.conf servers (runs on the DNS thread's event loop).

As upstream: servers are tried in resolv.conf order, each with its own timeout
(5 s by default), the first reply of any rcode wins; with `parallel` every
server is asked at once and the first reply wins. `query()` returns None when
every server failed, and the caller answers SERVFAIL. A UDP reply larger
than the query's own size limit (512 bytes, or its EDNS size) counts as that
server failing: upstream's Go client reads the datagram into a buffer of that
size and cannot parse the cut message, so such a server never answers there.

UDP queries go out on a few long-lived connected sockets per server with a
fresh random id each (a socket per query, as Go does, costs too much here).
Connected sockets let the kernel drop replies from anyone but the server, and
report ICMP port-unreachable, so a dead server fails fast instead of timing
out. A reply is accepted only if its id and question match what we sent.
TCP queries use one connection per query.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from istio_agent.dns.core import wire

MAX_PENDING_PER_SOCKET = 20_000  # of 65,536 ids: leave room for random picks to succeed fast


def _connected_udp_socket(server: tuple[str, int]) -> socket.socket:
    """A non-blocking UDP socket connected to `server` (a numeric address: connect(2) sends nothing)."""
    family = socket.AF_INET6 if ":" in server[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.connect(server)
    except OSError:
        sock.close()
        raise
    return sock


@dataclass(frozen=True, slots=True)
class ResolvConf:
    servers: tuple[str, ...]
    search: tuple[str, ...]


def parse_resolv_conf(text: str) -> ResolvConf:
    """Nameservers and search domains; the last `search` or `domain` line wins (as libc)."""
    servers: list[str] = []
    search: list[str] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].split(";", 1)[0].split()
        if len(line) < 2:
            continue
        if line[0] == "nameserver":
            servers.append(line[1])
        elif line[0] == "search":
            search = line[1:]
        elif line[0] == "domain":
            search = [line[1]]
    return ResolvConf(servers=tuple(servers), search=tuple(search))


def read_resolv_conf(path: str | Path) -> ResolvConf:
    return parse_resolv_conf(Path(path).read_text())


class UpstreamError(Exception):
    """One upstream server did not give a usable answer."""


def _question_end(data: bytes) -> int:
    return wire.skip_name(data, 12) + 4


Reply = Callable[[bytes | None], None]  # called once with the reply, or None on failure


class _UdpUpstream(asyncio.DatagramProtocol):
    """One connected UDP socket to one server, multiplexing queries by id.

    Callbacks rather than futures: a forwarded query is the proxy's second
    hottest path, and a Task plus a Future per query cost more than the rest.
    """

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self.transport: asyncio.DatagramTransport | None = None
        # id -> (callback, lower-cased question, deadline, largest acceptable reply);
        # insertion order = deadline order.
        self.pending: dict[int, tuple[Reply, bytes, float, int]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's UDP transport does not subclass asyncio.DatagramTransport: no isinstance check.
        self.transport = cast(asyncio.DatagramTransport, transport)

    def send(self, data: bytes, qend: int, deadline: float, reply: Reply, limit: int) -> bool:
        """Send with a fresh id; False (and no callback) when the socket cannot take it."""
        if self.transport is None or self.transport.is_closing() or len(self.pending) >= MAX_PENDING_PER_SOCKET:
            return False
        qid = self._rng.getrandbits(16)
        while qid in self.pending:
            qid = self._rng.getrandbits(16)
        self.pending[qid] = (reply, data[12:qend].lower(), deadline, limit)
        self.transport.sendto(qid.to_bytes(2, "big") + data[2:])
        return True

    def datagram_received(self, data: bytes, addr: object) -> None:
        if len(data) < 12 or not data[2] & 0x80:
            return
        qid = (data[0] << 8) | data[1]
        entry = self.pending.get(qid)
        if entry is None:
            return
        reply, question, _, limit = entry
        if data[12:12 + len(question)].lower() != question:
            return  # not the answer to our question: keep waiting for the real one
        del self.pending[qid]
        reply(data if len(data) <= limit else None)

    def error_received(self, exc: Exception) -> None:
        self.fail_all()

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail_all()

    def fail_all(self) -> None:
        pending, self.pending = self.pending, {}
        for reply, *_ in pending.values():
            reply(None)

    def expire(self, now: float) -> None:
        expired = []
        for qid, (_, _, deadline, _) in self.pending.items():
            if deadline > now:
                break
            expired.append(qid)
        for qid in expired:
            self.pending.pop(qid)[0](None)


class _UdpExchange:
    """One forwarded UDP query: servers in order (or all at once), first reply wins."""

    __slots__ = ("data", "done", "failures", "finished", "forwarder", "limit", "next_server", "qend")

    def __init__(self, forwarder: Forwarder, data: bytes, qend: int, done: Reply, limit: int) -> None:
        self.forwarder = forwarder
        self.data = data
        self.qend = qend
        self.done = done
        self.limit = limit
        self.next_server = 0
        self.failures = 0
        self.finished = False

    def start(self) -> None:
        if not self.forwarder.servers:
            self._finish(None)
        elif self.forwarder.parallel:
            for _ in self.forwarder.servers:
                self._send_next()
        else:
            self._send_next()

    def _send_next(self) -> None:
        servers = self.forwarder.servers
        while self.next_server < len(servers):
            server = servers[self.next_server]
            self.next_server += 1
            if self.forwarder.send_udp(server, self.data, self.qend, self.on_reply, self.limit):
                return
            self.failures += 1
        if self.failures >= len(servers):
            self._finish(None)

    def on_reply(self, resp: bytes | None) -> None:
        if self.finished:
            return
        if resp is not None:
            self._finish(resp)
            return
        self.failures += 1
        if not self.forwarder.parallel:
            self._send_next()
        elif self.failures >= len(self.forwarder.servers):
            self._finish(None)

    def _finish(self, resp: bytes | None) -> None:
        if not self.finished:
            self.finished = True
            self.done(resp)


class Forwarder:
    """Sends queries to the upstream servers. Create, use and close on one event loop."""

    def __init__(self, servers: list[tuple[str, int]], *, parallel: bool = False, timeout: float = 5.0,
                 sockets_per_server: int = 2) -> None:
        self.servers = servers
        self.parallel = parallel
        self.timeout = timeout
        self._sockets_per_server = sockets_per_server
        self._rng = random.Random()
        self._udp: dict[tuple[str, int], list[_UdpUpstream]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        for server in self.servers:
            endpoints = []
            for _ in range(self._sockets_per_server):
                try:
                    sock = _connected_udp_socket(server)
                except OSError:
                    continue  # unroutable server: every query to it fails and moves on
                # A socket of ours, not remote_addr=: uvloop resolves a remote_addr with getaddrinfo on libuv's
                # thread pool, whose four threads then stay (~0.4 MB) for an address that is already numeric.
                _, proto = await loop.create_datagram_endpoint(lambda: _UdpUpstream(self._rng), sock=sock)
                endpoints.append(proto)
            self._udp[server] = endpoints
        self._sweeper = loop.create_task(self._sweep())

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for endpoints in self._udp.values():
            for proto in endpoints:
                if proto.transport is not None:
                    proto.transport.close()
                proto.fail_all()
        self._udp = {}

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        tick = max(0.01, min(0.25, self.timeout / 10))
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            for endpoints in self._udp.values():
                for proto in endpoints:
                    proto.expire(now)

    def query_udp(self, data: bytes, done: Reply, limit: int = wire.MAX_MSG_SIZE) -> None:
        """Forward a validated query over UDP; `done` gets the first reply, or None when all failed.

        `limit` is the query's own UDP size limit (`Query.udp_limit`): a server
        replying with more has failed. `done` may be called before this returns
        (no usable server).
        """
        try:
            qend = _question_end(data)
        except wire.WireError:
            done(None)
            return
        _UdpExchange(self, data, qend, done, limit).start()

    def send_udp(self, server: tuple[str, int], data: bytes, qend: int, reply: Reply, limit: int) -> bool:
        endpoints = self._udp.get(server)
        if not endpoints:
            return False
        proto = endpoints[self._rng.randrange(len(endpoints))] if len(endpoints) > 1 else endpoints[0]
        assert self._loop is not None
        return proto.send(data, qend, self._loop.time() + self.timeout, reply, limit)

    async def query(self, data: bytes, tcp: bool, limit: int = wire.MAX_MSG_SIZE) -> bytes | None:
        """The first upstream reply to a validated query, or None when every server failed.

        `limit` as for query_udp(); TCP replies are limited by their framing only.
        """
        if not self.servers:
            return None
        if not tcp:
            future: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()

            def resolve(resp: bytes | None) -> None:
                if not future.done():
                    future.set_result(resp)

            self.query_udp(data, resolve, limit)
            return await future
        if self.parallel and len(self.servers) > 1:
            return await self._parallel_tcp(data)
        for server in self.servers:
            try:
                return await self._exchange_tcp(server, data, _question_end(data))
            except (UpstreamError, OSError, TimeoutError, wire.WireError, asyncio.IncompleteReadError):
                continue
        return None

    async def _parallel_tcp(self, data: bytes) -> bytes | None:
        qend = _question_end(data)
        tasks = [asyncio.ensure_future(self._exchange_tcp(server, data, qend)) for server in self.servers]
        try:
            for next_done in asyncio.as_completed(tasks):
                try:
                    return await next_done
                except (UpstreamError, OSError, TimeoutError, wire.WireError, asyncio.IncompleteReadError):
                    continue
            return None
        finally:
            for task in tasks:
                task.cancel()
            # Retrieve the results of losers so asyncio does not log them as never retrieved.
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _exchange_tcp(self, server: tuple[str, int], data: bytes, qend: int) -> bytes:
        async with asyncio.timeout(self.timeout):
            reader, writer = await asyncio.open_connection(server[0], server[1])
            try:
                writer.write(len(data).to_bytes(2, "big") + data)
                while True:
                    size = int.from_bytes(await reader.readexactly(2), "big")
                    resp = await reader.readexactly(size)
                    if (len(resp) >= 12 and resp[:2] == data[:2] and resp[2] & 0x80
                            and resp[12:qend].lower() == data[12:qend].lower()):
                        return resp
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
