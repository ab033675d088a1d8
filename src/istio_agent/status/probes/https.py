"""The app prober's HTTP client: HTTP/1.1 on h11, and HTTPS with HTTP/2 offered (ISTIO_ENABLE_HTTP2_PROBING).

As upstream's prober (Kubernetes' settings): TLS without verification offers
ALPN `h2` and `http/1.1`; an app that selects h2 is probed over HTTP/2
(`h2`, imported when an app first selects it), any other answer means
HTTP/1.1 (`httpio.client`, on h11) on the same connection, so an app sees one
connection either way; with the setting off, TLS offers no ALPN (HTTP/1.1
only). Plain-HTTP probes are HTTP/1.1 on the same client (no h2c, as upstream).
The prober imports this module on its first HTTP probe, the TLS context is made
on the first HTTPS one and h2 loads only when an app selects it: every agent's
resident memory counts.

Connections follow ENABLE_PROBE_KEEPALIVE_CONNECTIONS: one per request,
closed after it, unless keep-alive is on; then an HTTP/1.1 connection is
reused when its last answer was read to the end, and one HTTP/2 connection
per destination carries every probe. A kept HTTP/2 connection is
pinged and dropped by `ConnectionHealth`'s rules; any connection unused for
90 s is dropped. What is sent and how the body is decoded is `wire`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, TypeAlias
from urllib.parse import urlsplit

from istio_agent.httpio.client import READ_SIZE, Closer, H1Connection, Response
from istio_agent.status.probes.wire import (
    ALPN_PROTOCOLS,
    H2_PING_TIMEOUT,
    H2_READ_IDLE_TIMEOUT,
    IDLE_CONNECTION_TIMEOUT,
    TLS_HANDSHAKE_TIMEOUT,
    ConnectionHealth,
    h1_headers,
    request_target,
)

if TYPE_CHECKING:
    from istio_agent.status.probes.h2 import H2Connection

log = logging.getLogger("istio_agent.probes")



def insecure_context(alpn: bool) -> ssl.SSLContext:
    """The kubelet does not verify an HTTPS probe's certificate, and neither does upstream; ALPN offers h2 first
    (none at all when HTTP/2 probing is off, as upstream's transport without HTTP/2 configured)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.options |= ssl.OP_NO_COMPRESSION
    if alpn:
        context.set_alpn_protocols(list(ALPN_PROTOCOLS))
    return context


# ---- the client ------------------------------------------------------------------------------------------

Connection: TypeAlias = "H1Connection | H2Connection"
PoolKey = tuple[str, str | None, str, int]  # scheme, source address, host, port


class HttpsProber:
    """The probes' GETs, HTTP and HTTPS (h2 offered with `alpn`); connections kept per
    (scheme, source, host, port) when `keepalive`. The TLS context is made on the first HTTPS probe."""

    def __init__(self, keepalive: bool, *, alpn: bool = True, read_idle: float = H2_READ_IDLE_TIMEOUT,
                 ping_timeout: float = H2_PING_TIMEOUT) -> None:
        self.keepalive, self.alpn = keepalive, alpn
        self.read_idle, self.ping_timeout = read_idle, ping_timeout
        self._context: ssl.SSLContext | None = None
        self._pool: dict[PoolKey, list[Connection]] = {}
        self._closer = Closer()

    @contextlib.asynccontextmanager
    async def get(self, url: str, headers: Iterable[tuple[str, str]], host: str | None,
                  source: str | None) -> AsyncIterator[Response]:
        """GET `url` (http or https) with `headers` and `host` as the Host/:authority (None: the URL's)."""
        split = urlsplit(url)
        netloc, target = request_target(url)
        scheme = split.scheme.lower()
        if scheme not in ("http", "https"):
            raise ValueError(f"unsupported scheme {split.scheme!r}")
        hostname, port = split.hostname or "", split.port or (443 if scheme == "https" else 80)
        key = (scheme, source, hostname, port)
        connection = await self._acquire(key)
        response: Response | None = None
        try:
            authority = host or netloc
            if isinstance(connection, H1Connection):
                response = await connection.request(authority, target, h1_headers(authority, headers, self.keepalive))
            else:
                response = await connection.request(authority, target, headers)
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
        scheme, source, hostname, port = key
        local = (source, 0) if source else None
        if scheme == "http":
            reader, writer = await asyncio.open_connection(hostname.strip("[]"), port, local_addr=local,
                                                           limit=READ_SIZE)
            return H1Connection(reader, writer, self.keepalive, self._closer)
        if self._context is None:
            self._context = insecure_context(self.alpn)
        reader, writer = await asyncio.open_connection(
            hostname, port, ssl=self._context, server_hostname=hostname, local_addr=local,
            ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT, limit=READ_SIZE)
        ssl_object = writer.get_extra_info("ssl_object")
        selected = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        log.debug("probe connection to %s:%d: ALPN %s", hostname, port, selected or "none (HTTP/1.1)")
        if selected == "h2":
            from istio_agent.status.probes.h2 import H2Connection  # only when an app selects h2

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
