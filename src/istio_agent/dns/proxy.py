"""The DNS proxy component: UDP and TCP on DNS_PROXY_ADDR, answering off the agent's event loop.

Threads, and why (benchmarks/bench_dns.py measures it in every run): with
answering on the agent's loop, each 50 ms burst of other work (an xDS push, a
metrics scrape) stalls every DNS answer behind it; with the agent loop busy
that way, dnsperf measured ~2.6k QPS answering on that loop against ~64k QPS
on the proxy's own threads (~160-200k idle). So:

* one thread per UDP socket runs a blocking recvfrom/sendto loop around the
  sans-IO Responder. A blocking loop beat a uvloop datagram endpoint by ~10% and
  each syscall releases the GIL, so a busy agent loop slows answers down (GIL
  sharing) but cannot stop them;
* one "dns-io" thread runs its own event loop (uvloop when importable) for the
  TCP listeners and for forwarding to upstream servers.

The agent's loop only calls `start()`, `stop()` and `update_name_table()` (or
its `_async` variant, which compiles on a worker thread).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import ipaddress
import logging
import socket
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from istio_agent.dns.core import wire
from istio_agent.dns.core.answers import CompiledTable
from istio_agent.dns.core.responder import FAILED, FORWARDED, MALFORMED, AskUpstream, Responder
from istio_agent.dns.core.table import build_lookup, proxy_domain
from istio_agent.dns.core.tcp_admission import ConnectionTable
from istio_agent.dns.forward import Forwarder, read_resolv_conf
from istio_agent.dns.metrics import UPSTREAM_FAILURES, DnsMetrics
from istio_agent.dns.options import DnsProxyOptions
from istio_agent.dns.tcp import TcpConnection
from istio_agent.eventloop import new_event_loop
from istio_agent.metrics import CollectorRegistry
from istio_agent.netaddr import AddressError, split_host_port
from istio_agent.protos import nds_pb2

log = logging.getLogger(__name__)
_EPHEMERAL_ATTEMPTS = 20


def listen_host_port(addr: str) -> tuple[str, int]:
    """DNS_PROXY_ADDR (`host:port`, `[v6]:port`, `:port`) -> (host, port), split by the project's one rule.

    ValueError names the setting, so a bad DNS_PROXY_ADDR is told apart from
    any other address the agent was given.
    """
    try:
        return split_host_port(addr)
    except AddressError as err:
        raise ValueError(f"DNS address: {err}") from None


class DnsProxy:
    """The agent's DNS proxy. `await start()`, feed `update_name_table()`, `await stop()`."""

    def __init__(self, options: DnsProxyOptions, registry: CollectorRegistry | None = None) -> None:
        self.options = options
        self.metrics = DnsMetrics(registry)
        self.responder = Responder(respond_before_sync=options.respond_before_sync)
        self._domain = proxy_domain(options.namespace, options.domain)
        self._search: tuple[str, ...] = ()
        self._udp_socks: list[socket.socket] = []
        self._tcp_socks: list[socket.socket] = []
        self._udp_threads: list[threading.Thread] = []
        self._io_thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._forwarder: Forwarder | None = None
        self._tcp_servers: list[asyncio.AbstractServer] = []
        # Open TCP connections and who may hold a slot; touched only on the dns-io loop.
        self.tcp_table: ConnectionTable[TcpConnection] = ConnectionTable(
            options.max_tcp_connections, options.max_tcp_connections_per_source)
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending_forwards = 0
        self._inbox: collections.deque[tuple[bytes, tuple[Any, ...], socket.socket, int]] = collections.deque()
        self._inbox_scheduled = False
        self._stopping = False
        self._udp_forward_counts = self.metrics.counts("udp")
        self.tcp_counts = self.metrics.counts("tcp")
        self.addresses: list[tuple[str, int]] = []  # bound (host, port), same port for UDP and TCP

    # ---- name table -------------------------------------------------------------------------

    def update_name_table(self, table: nds_pb2.NameTable) -> None:
        """Compile `table` and swap it in; answers switch over atomically.

        Compiling costs about 40 ms per 1,000 services on the calling thread; from the
        agent's event loop prefer `update_name_table_async()`.
        """
        self.responder.table = self._compile(table)

    async def update_name_table_async(self, table: nds_pb2.NameTable) -> None:
        """As update_name_table(), compiling on a worker thread so the caller's loop keeps running.

        Tables are swapped in the order the calls complete; callers serialize updates.
        """
        self.responder.table = await asyncio.to_thread(self._compile, table)

    def _compile(self, table: nds_pb2.NameTable) -> CompiledTable:
        lookup = build_lookup(table, self.options.namespace, self._domain, self._search)
        return CompiledTable(table, lookup)

    def name_table(self) -> nds_pb2.NameTable | None:
        """The NameTable being served (for /debug/ndsz), None before the first one."""
        table = self.responder.table
        return None if table is None else table.source

    def is_ready(self) -> bool:
        return self.responder.table is not None

    # ---- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        conf = read_resolv_conf(self.options.resolv_conf)
        self._search = conf.search
        table = self.responder.table
        if table is not None:  # a table set before start() used the search list we did not know yet
            self.update_name_table(table.source)
        servers = [(s, self.options.upstream_port) for s in conf.servers]
        self._bind()
        loop = new_event_loop(prefer_uvloop=self.options.use_uvloop)
        self._loop = loop
        self._forwarder = Forwarder(servers, parallel=self.options.forward_parallel,
                                    timeout=self.options.upstream_timeout)
        self._io_thread = threading.Thread(target=self._run_io_loop, name="dns-io", daemon=True)
        self._io_thread.start()
        try:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._io_start(), loop))
        except BaseException:
            await self.stop()
            raise
        for sock in self._udp_socks:
            thread = threading.Thread(target=self._udp_loop, args=(sock,), daemon=True,
                                      name=f"dns-udp-{sock.getsockname()[0]}")
            thread.start()
            self._udp_threads.append(thread)
        log.info("DNS proxy listening on %s (upstream %s, search %s)", self.addresses, servers, conf.search)

    async def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        for sock in self._udp_socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked recvfrom
        for thread in self._udp_threads:
            await asyncio.to_thread(thread.join)
        loop = self._loop
        if loop is not None and self._io_thread is not None:
            if self._io_thread.is_alive():
                with contextlib.suppress(Exception):
                    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._io_stop(), loop))
                loop.call_soon_threadsafe(loop.stop)
                await asyncio.to_thread(self._io_thread.join)
            loop.close()
        for sock in (*self._udp_socks, *self._tcp_socks):
            sock.close()

    def _bind_hosts(self, host: str) -> list[tuple[str, bool]]:
        """(address, required) pairs to bind; the IPv6 half is best effort.

        "localhost" means both loopbacks (Go would pick one; upstream binds both
        when resolv.conf has servers of both families); an empty host means every
        address, as Go's ":port".
        """
        if host == "localhost":
            return [("127.0.0.1", True), ("::1", False)]
        if host == "":
            return [("0.0.0.0", True), ("::", False)]
        try:
            ipaddress.ip_address(host)
            return [(host, True)]
        except ValueError:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
            return [(str(infos[0][4][0]), True)]

    def _bind(self) -> None:
        """Bind UDP and TCP on the same port; an ephemeral port (":0") is tried afresh while TCP
        cannot take the one UDP was given (a TCP connection elsewhere can hold it)."""
        host, port = listen_host_port(self.options.addr)
        for attempt in range(_EPHEMERAL_ATTEMPTS if port == 0 else 1):
            try:
                self._bind_port(host, port)
                return
            except OSError as exc:
                if port != 0 or exc.errno != errno.EADDRINUSE or attempt == _EPHEMERAL_ATTEMPTS - 1:
                    raise

    def _bind_port(self, host: str, port: int) -> None:
        try:
            for address, required in self._bind_hosts(host):
                family = socket.AF_INET6 if ":" in address else socket.AF_INET
                udp = socket.socket(family, socket.SOCK_DGRAM)
                tcp = socket.socket(family, socket.SOCK_STREAM)
                try:
                    if family == socket.AF_INET6:
                        udp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                        tcp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    with contextlib.suppress(OSError):
                        udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.options.udp_receive_buffer)
                    udp.bind((address, port))
                    port = udp.getsockname()[1]  # an ephemeral port is shared by every listener
                    tcp.bind((address, port))
                    tcp.listen(128)
                    tcp.setblocking(False)
                except OSError as exc:
                    udp.close()
                    tcp.close()
                    if required or exc.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                        raise
                    log.info("DNS proxy: not listening on %s: %s", address, exc)
                    continue
                self._udp_socks.append(udp)
                self._tcp_socks.append(tcp)
                self.addresses.append((address, port))
        except BaseException:
            for sock in (*self._udp_socks, *self._tcp_socks):
                sock.close()
            self._udp_socks, self._tcp_socks, self.addresses = [], [], []
            raise

    # ---- dns-io thread ----------------------------------------------------------------------

    def _run_io_loop(self) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()
        # Let cancelled tasks finish unwinding before the loop is closed by stop().
        pending = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))

    async def _io_start(self) -> None:
        assert self._forwarder is not None
        await self._forwarder.start()
        loop = asyncio.get_running_loop()
        for sock in self._tcp_socks:
            server = await loop.create_server(lambda: TcpConnection(self), sock=sock)
            self._tcp_servers.append(server)

    async def _io_stop(self) -> None:
        for server in self._tcp_servers:
            server.close()
        for conn in self.tcp_table:
            conn.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._forwarder is not None:
            await self._forwarder.close()

    def spawn(self, coro: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run a forwarding coroutine on the io loop (from that loop), keeping a reference until it ends."""
        task = asyncio.ensure_future(coro())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def forward(self, data: bytes, limit: int, tcp: bool) -> bytes:
        """Upstream's answer to a validated query (id restored, cut to `limit`), or SERVFAIL
        when every upstream failed or too many queries are already in flight."""
        counts = self.tcp_counts if tcp else self._udp_forward_counts
        if self._pending_forwards >= self.options.max_pending_forwards:
            return self._finish_forward(data, None, limit, None, counts)
        assert self._forwarder is not None and self._loop is not None
        self._pending_forwards += 1
        start = self._loop.time()
        try:
            resp = await self._forwarder.query(data, tcp, limit)
        finally:
            self._pending_forwards -= 1
        return self._finish_forward(data, resp, limit, start, counts)

    def _finish_forward(self, data: bytes, resp: bytes | None, limit: int, start: float | None,
                        counts: list[int]) -> bytes:
        counts_index = FAILED if resp is None else FORWARDED
        counts[counts_index] += 1
        if resp is None:
            if start is not None:  # all upstreams failed (else: shed before asking anyone)
                counts[UPSTREAM_FAILURES] += 1
            return wire.error_reply(data, wire.parse_query(data), wire.RCODE_SERVFAIL)
        assert self._loop is not None and start is not None
        self.metrics.upstream_latency.observe(self._loop.time() - start)
        return wire.fit(data[:2] + resp[2:], limit)

    def _enqueue_forward(self, item: tuple[bytes, tuple[Any, ...], socket.socket, int]) -> None:
        """From a UDP thread: queue a query for the io loop, waking it only if it is not already due.

        Under load one wake-up then carries many queries across threads.
        """
        self._inbox.append(item)
        if not self._inbox_scheduled:
            self._inbox_scheduled = True
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._drain_inbox)

    def _drain_inbox(self) -> None:
        self._inbox_scheduled = False  # before draining: a query appended from now on schedules again
        inbox = self._inbox
        while inbox:
            data, addr, sock, limit = inbox.popleft()
            self._forward_udp(data, addr, sock, limit)

    def _forward_udp(self, data: bytes, addr: tuple[Any, ...], sock: socket.socket, limit: int) -> None:
        counts = self._udp_forward_counts
        if self._pending_forwards >= self.options.max_pending_forwards:
            with contextlib.suppress(OSError):
                sock.sendto(self._finish_forward(data, None, limit, None, counts), addr)
            return
        assert self._forwarder is not None and self._loop is not None
        self._pending_forwards += 1
        start = self._loop.time()

        def done(resp: bytes | None) -> None:
            self._pending_forwards -= 1
            out = self._finish_forward(data, resp, limit, start, counts)
            with contextlib.suppress(OSError):
                sock.sendto(out, addr)

        self._forwarder.query_udp(data, done, limit)

    # ---- UDP threads ------------------------------------------------------------------------

    def _udp_loop(self, sock: socket.socket) -> None:
        counts = self.metrics.counts("udp")
        respond = self.responder.respond
        recv = sock.recvfrom
        send = sock.sendto
        forward = self._enqueue_forward
        while True:
            try:
                data, addr = recv(65535)
            except OSError:
                if self._stopping:
                    return
                continue
            if addr is None:  # woken by shutdown()
                return
            try:
                result = respond(data, False, counts)
            except Exception:  # the responder never raises; if it does, lose one packet, not the server
                log.exception("DNS proxy: failed to answer a UDP query")
                counts[MALFORMED] += 1
                continue
            if result is None:
                continue
            if type(result) is bytes:
                try:
                    send(result, addr)
                except OSError:
                    pass
            elif isinstance(result, AskUpstream):
                try:
                    forward((data, addr, sock, result.limit))
                except RuntimeError:  # loop closed while stopping
                    return
