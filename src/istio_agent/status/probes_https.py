"""HTTPS app probes with HTTP/2 offered (ISTIO_ENABLE_HTTP2_PROBING, on by default): the I/O edge.

As upstream's prober (Kubernetes' settings): TLS without verification offers
ALPN `h2` and `http/1.1`; an app that selects h2 is probed over HTTP/2
(`probes_h2`, imported when an app first selects it), any other answer means
HTTP/1.1 (`h11`, here) on the same connection, so an app sees one connection
either way. The prober imports this module on the first such probe only: most
pods have no HTTPS probe, and every agent's resident memory counts.

Connections follow ENABLE_PROBE_KEEPALIVE_CONNECTIONS as on the aiohttp path:
one per request, closed after it, unless keep-alive is on; then an HTTP/1.1
connection is reused when its last answer was read to the end, and one HTTP/2
connection per destination carries every probe. A kept HTTP/2 connection is
pinged and dropped by `ConnectionHealth`'s rules; any connection unused for
90 s is dropped. What is sent and how the body is decoded is `probes_wire`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, TypeAlias
from urllib.parse import urlsplit

import h11

from istio_agent.status.probes_wire import (
    ALPN_PROTOCOLS,
    H2_PING_TIMEOUT,
    H2_READ_IDLE_TIMEOUT,
    IDLE_CONNECTION_TIMEOUT,
    TLS_HANDSHAKE_TIMEOUT,
    BodyDecoder,
    ConnectionHealth,
    h1_headers,
    request_target,
)

if TYPE_CHECKING:
    from istio_agent.status.probes_h2 import H2Connection

log = logging.getLogger("istio_agent.probes")

READ_SIZE = 65536
SHUTDOWN_TIMEOUT = 5.0  # for the app's TLS close_notify, then the socket is dropped


class Closer:
    """Ends connections: TLS closed politely in the background (bounded), or dropped when the app is unresponsive.

    The background closes are kept so that the prober's `close` can wait for them.
    """

    def __init__(self) -> None:
        self._pending: set[asyncio.Task[None]] = set()

    def __call__(self, writer: asyncio.StreamWriter, polite: bool = True) -> None:
        if not polite:
            writer.transport.abort()
            return
        if writer.is_closing():
            return
        writer.close()
        task = asyncio.get_running_loop().create_task(self._wait(writer), name="probe-connection-close")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    @staticmethod
    async def _wait(writer: asyncio.StreamWriter) -> None:
        closed = False
        try:
            async with asyncio.timeout(SHUTDOWN_TIMEOUT):
                await writer.wait_closed()
            closed = True
        except (TimeoutError, OSError):
            pass
        finally:
            if not closed:
                writer.transport.abort()

    async def wait(self, timeout: float) -> None:
        """Give the closes under way `timeout` seconds, then drop what is left (the agent is stopping)."""
        if not self._pending:
            return
        _, late = await asyncio.wait(set(self._pending), timeout=timeout)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)


def insecure_alpn_context() -> ssl.SSLContext:
    """The kubelet does not verify an HTTPS probe's certificate, and neither does upstream; ALPN offers h2 first."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.options |= ssl.OP_NO_COMPRESSION
    context.set_alpn_protocols(list(ALPN_PROTOCOLS))
    return context


def latin1(value: bytes | str) -> str:
    """A header name or value as text (HTTP headers are bytes; latin-1 maps each to one character)."""
    return value.decode("latin-1") if isinstance(value, bytes) else value


class Response:
    """An app's answer: status, headers (names lower-cased), and the body decoded, read in pieces."""

    def __init__(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.status = status
        self.headers = headers
        self.decoder = BodyDecoder(self.header("content-encoding"))

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((value for key, value in self.headers if key == name), None)

    async def read(self, size: int) -> bytes:
        """Up to `size` bytes of the decoded body; b"" at its end."""
        while True:
            out = self.decoder.take(size)
            if out or size <= 0:
                return out
            data = await self._more()
            if data is None:
                return self.decoder.take(size)
            self.decoder.feed(data)

    async def _more(self) -> bytes | None:
        """The next raw piece of the body, None at its end."""
        raise NotImplementedError

    def release(self) -> None:
        """Done with the answer, read or not."""


# ---- HTTP/1.1 ------------------------------------------------------------------------------------------


class H1Connection:
    protocol = "http/1.1"

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keepalive: bool,
                 closer: Closer) -> None:
        self.reader, self.writer, self.keepalive, self.closer = reader, writer, keepalive, closer
        self.h11 = h11.Connection(h11.CLIENT)
        self.last_used = asyncio.get_running_loop().time()

    def usable(self, now: float) -> bool:
        return (not self.writer.is_closing() and not self.reader.at_eof() and self.h11.our_state is h11.IDLE
                and now - self.last_used < IDLE_CONNECTION_TIMEOUT)

    async def request(self, authority: str, target: str, headers: Iterable[tuple[str, str]]) -> Response:
        try:
            data = self.h11.send(h11.Request(method="GET", target=target,
                                             headers=h1_headers(authority, headers, self.keepalive)))
            data = (data or b"") + (self.h11.send(h11.EndOfMessage()) or b"")
            self.writer.write(data)
            await self.writer.drain()
            while True:
                event = await self._next_event()
                if isinstance(event, h11.Response):
                    return H1Response(self, event)
                if not isinstance(event, h11.InformationalResponse):
                    raise ConnectionError(f"unexpected HTTP/1.1 event {type(event).__name__}")
        except h11.ProtocolError as exc:
            raise ConnectionError(f"HTTP/1.1: {exc}") from None

    async def _next_event(self) -> object:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self.reader.read(READ_SIZE))
                continue
            if isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("the app closed the connection")
            return event

    def finished_cleanly(self) -> bool:
        """Both sides done with this exchange and the connection may carry another: ready it."""
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            self.last_used = asyncio.get_running_loop().time()
            return True
        return False

    def close(self) -> None:
        self.closer(self.writer)


class H1Response(Response):
    def __init__(self, connection: H1Connection, event: h11.Response) -> None:
        super().__init__(event.status_code, [(latin1(n).lower(), latin1(v)) for n, v in event.headers])
        self.connection = connection
        self.ended = False

    async def _more(self) -> bytes | None:
        if self.ended:
            return None
        try:
            event = await self.connection._next_event()
        except h11.ProtocolError as exc:
            raise ConnectionError(f"HTTP/1.1: {exc}") from None
        if isinstance(event, h11.Data):
            return bytes(event.data)
        self.ended = True  # EndOfMessage
        return None

    def release(self) -> None:
        """Take what is already buffered (an empty body usually is): a finished exchange leaves the
        connection reusable, as aiohttp's release does; nothing more is read from the socket."""
        with contextlib.suppress(h11.ProtocolError):
            while not self.ended:
                event = self.connection.h11.next_event()
                if event is h11.NEED_DATA or not isinstance(event, (h11.Data, h11.EndOfMessage)):
                    break
                self.ended = isinstance(event, h11.EndOfMessage)


# ---- the client ------------------------------------------------------------------------------------------

Connection: TypeAlias = "H1Connection | H2Connection"
PoolKey = tuple[str | None, str, int]


class HttpsProber:
    """GETs over HTTPS with h2 offered; connections kept per (source, host, port) when `keepalive`."""

    def __init__(self, keepalive: bool, *, read_idle: float = H2_READ_IDLE_TIMEOUT,
                 ping_timeout: float = H2_PING_TIMEOUT) -> None:
        self.keepalive = keepalive
        self.read_idle, self.ping_timeout = read_idle, ping_timeout
        self._context = insecure_alpn_context()
        self._pool: dict[PoolKey, list[Connection]] = {}
        self._closer = Closer()

    @contextlib.asynccontextmanager
    async def get(self, url: str, headers: Iterable[tuple[str, str]], host: str | None,
                  source: str | None) -> AsyncIterator[Response]:
        """GET `url` (https) with `headers` and `host` as the Host/:authority (None: the URL's)."""
        split = urlsplit(url)
        netloc, target = request_target(url)
        hostname, port = split.hostname or "", split.port or 443
        key = (source, hostname, port)
        connection = await self._acquire(key)
        response: Response | None = None
        try:
            response = await connection.request(host or netloc, target, headers)
            yield response
        finally:
            if response is not None:
                response.release()
            self._release(key, connection, clean=response is not None)

    async def _acquire(self, key: PoolKey) -> Connection:
        now = asyncio.get_running_loop().time()
        kept = self._pool.get(key, [])
        for connection in list(kept):
            if not connection.usable(now):
                kept.remove(connection)
                if isinstance(connection, H1Connection) or not connection.streams:
                    connection.close()
                continue
            if isinstance(connection, H1Connection):
                kept.remove(connection)  # one exchange at a time
            return connection
        return await self._connect(key)

    async def _connect(self, key: PoolKey) -> Connection:
        source, hostname, port = key
        reader, writer = await asyncio.open_connection(
            hostname, port, ssl=self._context, server_hostname=hostname,
            local_addr=(source, 0) if source else None, ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT)
        ssl_object = writer.get_extra_info("ssl_object")
        selected = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        log.debug("probe connection to %s:%d: ALPN %s", hostname, port, selected or "none (HTTP/1.1)")
        if selected == "h2":
            from istio_agent.status.probes_h2 import H2Connection  # only when an app selects h2

            health = ConnectionHealth(last_frame=asyncio.get_running_loop().time(), read_idle=self.read_idle,
                                      ping_timeout=self.ping_timeout,
                                      idle_timeout=IDLE_CONNECTION_TIMEOUT if self.keepalive else None)
            return H2Connection(reader, writer, health, self._closer)
        return H1Connection(reader, writer, self.keepalive, self._closer)

    def _release(self, key: PoolKey, connection: Connection, clean: bool) -> None:
        now = asyncio.get_running_loop().time()
        kept = self._pool.setdefault(key, [])
        if isinstance(connection, H1Connection):
            if self.keepalive and clean and connection.finished_cleanly() and connection.usable(now):
                kept.append(connection)
            else:
                connection.close()
            return
        if self.keepalive and connection.usable(now):
            if connection in kept:
                return
            if not any(not isinstance(other, H1Connection) and other.usable(now) for other in kept):  # one h2 per app
                kept.append(connection)
                return
        if connection in kept:
            kept.remove(connection)
        if not connection.streams:
            connection.close()

    def kept(self) -> list[Connection]:
        """The connections held for later probes (debugging and tests)."""
        return [connection for kept in self._pool.values() for connection in kept]

    async def close(self) -> None:
        tasks = []
        for kept in self._pool.values():
            for connection in kept:
                connection.close()
                if not isinstance(connection, H1Connection):
                    tasks.append(connection.task)
        self._pool.clear()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._closer.wait(timeout=1.0)
