"""DNS over TCP (RFC 7766): 2-byte length framing, pipelined queries, idle timeout, back-pressure.

Runs on the DNS proxy's io loop. Local answers are written in order at once;
forwarded queries are answered when upstream replies (out of order, as the
RFC allows). A connection stops reading while it has too many forwarded
queries in flight or while the client is not reading our answers.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, cast

from istio_agent.dns.responder import MALFORMED, AskUpstream

if TYPE_CHECKING:
    from istio_agent.dns.proxy import DnsProxy

log = logging.getLogger(__name__)

TCP_MAX_INFLIGHT = 64  # forwarded queries per TCP connection before we stop reading from it


class TcpConnection(asyncio.Protocol):
    """One DNS-over-TCP client: 2-byte length framing, pipelined queries, idle timeout."""

    def __init__(self, proxy: DnsProxy) -> None:
        self.proxy = proxy
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.inflight = 0
        self.reading_paused = False
        self.last_activity = 0.0
        self.idle_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio subclasses
        if len(self.proxy.tcp_conns) >= self.proxy.options.max_tcp_connections:
            transport.close()
            return
        self.proxy.tcp_conns.add(self)
        loop = asyncio.get_running_loop()
        self.last_activity = loop.time()
        self.idle_timer = loop.call_later(self.proxy.options.tcp_idle_timeout, self._check_idle)

    def connection_lost(self, exc: Exception | None) -> None:
        self.proxy.tcp_conns.discard(self)
        if self.idle_timer is not None:
            self.idle_timer.cancel()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _check_idle(self) -> None:
        loop = asyncio.get_running_loop()
        idle = loop.time() - self.last_activity
        timeout = self.proxy.options.tcp_idle_timeout
        if idle >= timeout and self.inflight == 0:
            self.close()
        else:
            self.idle_timer = loop.call_later(max(0.05, timeout - idle), self._check_idle)

    def pause_writing(self) -> None:  # the client is not reading: stop taking queries
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.reading_paused:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._drain()

    def _drain(self) -> None:
        assert self.transport is not None
        self.last_activity = asyncio.get_running_loop().time()
        buf = self.buffer
        respond = self.proxy.responder.respond
        counts = self.proxy.tcp_counts
        while len(buf) >= 2 and not self.reading_paused:
            size = (buf[0] << 8) | buf[1]
            if len(buf) < 2 + size:
                break
            msg = bytes(buf[2:2 + size])
            del buf[:2 + size]
            try:
                result = respond(msg, True, counts)
            except Exception:
                log.exception("DNS proxy: failed to answer a TCP query")
                counts[MALFORMED] += 1
                continue
            if type(result) is bytes:
                self._write(result)
            elif isinstance(result, AskUpstream):
                self._forward(msg, result.limit)

    def _write(self, resp: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(len(resp).to_bytes(2, "big") + resp)

    def _forward(self, msg: bytes, limit: int) -> None:
        self.inflight += 1
        if self.inflight >= TCP_MAX_INFLIGHT and self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()

        async def run() -> None:
            try:
                self._write(await self.proxy.forward(msg, limit, tcp=True))
            finally:
                self.inflight -= 1
                if self.reading_paused and self.inflight < TCP_MAX_INFLIGHT // 2 and self.transport is not None:
                    self.reading_paused = False
                    if not self.transport.is_closing():
                        self.transport.resume_reading()
                        self._drain()

        self.proxy.spawn(run)
