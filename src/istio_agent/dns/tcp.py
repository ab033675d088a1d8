"""DNS over TCP on the proxy's io loop: the asyncio adapter around `core.tcp_framing.TcpFramer`.

The framing, the in-flight accounting and the deadlines are the framer's
(sans-IO, unit-tested); this file only moves events between the transport,
the framer and the responder. Local answers are written in order at once;
forwarded queries are answered when upstream replies (out of order, as the
RFC allows). A connection stops reading while it has too many forwarded
queries in flight or while the client is not reading our answers. One timer
per connection is armed at the framer's deadline.

Which connections may stay open is `core.tcp_admission.ConnectionTable`'s call
(also sans-IO): each accepted connection asks it for a slot, keyed by the
peer's IP address, and reports its activity and whether forwarded queries
are in flight. A connection closed by a deadline or evicted for a newcomer
is aborted rather than closed when answers are still buffered for it: a
client that does not read them would otherwise keep the socket open, since
a graceful close waits for the buffer to drain.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, cast

from istio_agent.dns.core.responder import MALFORMED, AskUpstream, Responder
from istio_agent.dns.core.tcp_admission import ConnectionTable
from istio_agent.dns.core.tcp_framing import TcpFramer, frame
from istio_agent.dns.options import DnsProxyOptions

log = logging.getLogger(__name__)

TCP_MAX_INFLIGHT = 64  # forwarded queries per TCP connection before we stop reading from it


class TcpHost(Protocol):
    """The DNS proxy as its TCP connections see it (`proxy.DnsProxy` is one; this module does not import it)."""

    options: DnsProxyOptions
    responder: Responder
    tcp_table: ConnectionTable[TcpConnection]
    tcp_counts: list[int]

    async def forward(self, data: bytes, limit: int, tcp: bool) -> bytes: ...

    def spawn(self, coro: Callable[[], Coroutine[Any, Any, None]]) -> None: ...


class TcpConnection(asyncio.Protocol):
    """One DNS-over-TCP client: transport events -> framer -> responder, and back."""

    def __init__(self, proxy: TcpHost) -> None:
        self.proxy = proxy
        self._loop = asyncio.get_running_loop()
        options = proxy.options
        self.framer = TcpFramer(self._loop.time(), options.tcp_idle_timeout,
                                partial_frame_timeout=options.tcp_partial_frame_timeout,
                                first_message_timeout=options.tcp_first_query_timeout,
                                max_inflight=TCP_MAX_INFLIGHT)
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio subclasses
        peer = transport.get_extra_info("peername")
        source = peer[0] if isinstance(peer, tuple) and peer else peer
        decision = self.proxy.tcp_table.admit(self, source, self._loop.time())
        if decision.evict is not None:
            decision.evict.close()
        if not decision.admitted:
            self._lost = True
            transport.close()
            return
        self._arm_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.proxy.tcp_table.remove(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        """Close now: gracefully when nothing is left to write, else abort (the client is not reading)."""
        self._lost = True  # no timer from here on; connection_lost follows
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if transport.get_write_buffer_size():
            transport.abort()
        else:
            transport.close()

    # ---- the one timer ---------------------------------------------------------------------

    def _arm_timer(self) -> None:
        """Make sure a timer fires no later than the framer's deadline.

        A timer already due earlier is kept: activity only pushes the idle
        deadline later, and the early wake-up simply re-arms. Without a deadline
        (forwarded queries in flight) nothing is armed until one finishes.
        """
        if self._lost:
            return
        deadline = self.framer.deadline()
        if deadline is None:
            return
        if self._timer is not None:
            if self._timer_at <= deadline:
                return
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.framer.should_close(self._loop.time()):
            self.close()
        else:
            self._arm_timer()

    # ---- flow control ----------------------------------------------------------------------

    def pause_writing(self) -> None:  # the client is not reading: stop taking queries
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.framer.reading_paused:
            self.transport.resume_reading()

    # ---- queries ---------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._lost:  # refused, evicted or timed out: bytes already on their way in are not answered
            return
        now = self._loop.time()
        self.framer.receive_data(data, now)
        self.proxy.tcp_table.touch(self, now)
        self._answer()
        self._arm_timer()

    def _answer(self) -> None:
        """Answer or forward every complete query the framer hands out."""
        next_message = self.framer.next_message
        respond = self.proxy.responder.respond
        counts = self.proxy.tcp_counts
        while (msg := next_message()) is not None:
            try:
                result = respond(msg, True, counts)
            except Exception:  # the responder never raises; if it does, lose one query, not the connection
                log.exception("DNS proxy: failed to answer a TCP query")
                counts[MALFORMED] += 1
                continue
            if type(result) is bytes:
                self._write(result)
            elif isinstance(result, AskUpstream):
                self._forward(msg, result.limit)

    def _write(self, resp: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame(resp))

    def _forward(self, msg: bytes, limit: int) -> None:
        if self.framer.forward_started() and self.transport is not None:
            self.transport.pause_reading()
        self.proxy.tcp_table.set_busy(self, True)

        async def run() -> None:
            try:
                self._write(await self.proxy.forward(msg, limit, tcp=True))
            finally:
                self._forward_done()

        self.proxy.spawn(run)

    def _forward_done(self) -> None:
        now = self._loop.time()
        resume = self.framer.forward_finished(now)
        table = self.proxy.tcp_table
        table.set_busy(self, self.framer.inflight > 0)
        table.touch(self, now)  # an answer went out (or was given up): the client was served just now
        if resume:
            transport = self.transport
            if transport is not None and not transport.is_closing():
                transport.resume_reading()
                self._answer()
        self._arm_timer()
