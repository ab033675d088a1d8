"""The asyncio edge of the HTTP/1.1 server: sockets in, `ServerConnection` decides, `Router` dispatches.

One task per connection reads with the connection's deadline, answers its
requests in order and writes each answer with backpressure (a streamed body is
sent as it is produced, gzip-compressed on the way when the response asks).
A refused request is answered, reported to `on_malformed` and its connection
closed; a handler that fails is logged and answered 500.

For a port that untrusted clients reach, `Limits` can also cap the connections
(shared by source, `admission.ConnectionSlots`), bound how long a write may
wait for a client that stopped reading (and, with a small kernel send buffer,
how much is written before that shows), and give a new connection a short
deadline for its first request; `start(tls=...)` serves HTTPS through
`tls.TlsStream` (small per-connection buffers, the TLS handshake within the
request deadline). `head_check` sees a request's head before its body is read
and `render_error` words the refusals (a JSON API answers JSON).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import h11

from istio_agent.httpio.admission import ConnectionSlots
from istio_agent.httpio.routing import Router
from istio_agent.httpio.server_core import (
    HeadCheck,
    Limits,
    Malformed,
    Request,
    Response,
    ServerConnection,
    error_bytes,
    text_response,
)

if TYPE_CHECKING:
    import ssl

log = logging.getLogger(__name__)

READ_SIZE = 65536
CLOSE_TIMEOUT = 2.0  # for the last bytes to leave, then the socket is dropped
INTERNAL_ERROR = "500 Internal Server Error\n\nServer got itself in trouble"


class _Reader(Protocol):
    async def read(self, n: int) -> bytes: ...


class _Writer(Protocol):
    @property
    def transport(self) -> asyncio.WriteTransport: ...

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


def _peer_host(writer: _Writer) -> str | None:
    peer = writer.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else None


class HttpServer:
    """Serves `router` on one TCP address; `on_malformed(peer, reason)` hears of every refused request."""

    def __init__(self, router: Router, *, limits: Limits = Limits(),
                 on_malformed: Callable[[str | None, str], None] = lambda peer, reason: None,
                 head_check: HeadCheck | None = None,
                 render_error: Callable[[Malformed], Response] | None = None,
                 on_connection_closed: Callable[[], None] | None = None) -> None:
        self.router = router
        self.limits = limits
        self.on_malformed = on_malformed
        self.head_check = head_check
        self.render_error = render_error
        self.on_connection_closed = on_connection_closed
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._tls: ssl.SSLContext | None = None
        self.slots: ConnectionSlots[asyncio.Task[None]] | None = None
        if limits.max_connections is not None:
            self.slots = ConnectionSlots(limits.max_connections, limits.max_per_source or limits.max_connections)

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._connections)

    async def start(self, host: str | None, port: int, *, reuse_address: bool = True,
                    tls: ssl.SSLContext | None = None) -> int:
        """Listen (HTTPS with `tls`); the port bound (for port 0)."""
        self._tls = tls
        self._server = await asyncio.start_server(self._serve, host=host, port=port, reuse_address=reuse_address,
                                                  limit=READ_SIZE)
        return int(self._server.sockets[0].getsockname()[1])

    async def start_unix(self, path: str) -> None:
        """Listen on a unix socket at `path` (the caller prepares the path and the socket's mode)."""
        self._server = await asyncio.start_unix_server(self._serve, path=path, limit=READ_SIZE)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None
        for cleanup in self.router.cleanups:
            try:
                await cleanup()
            except Exception:
                log.exception("HTTP server: cleanup failed")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        stream: _Writer = writer
        cut = False
        try:
            if not self._admit(task, _peer_host(writer)):
                cut = True
                return
            if self.limits.send_buffer_bytes is not None:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.send_buffer_bytes)
            if self._tls is not None:
                from istio_agent.httpio.tls import TlsStream

                tls = TlsStream(reader, writer, self._tls)
                stream = tls
                try:
                    await asyncio.wait_for(tls.handshake(), self.limits.request_timeout)
                except (TimeoutError, OSError) as exc:  # ssl.SSLError is an OSError
                    self.on_malformed(_peer_host(writer), f"TLS handshake: {exc or 'not completed in time'}")
                    cut = True
                    return
                cut = await self._serve_stream(tls, tls, task)
            else:
                cut = await self._serve_stream(reader, writer, task)
        except (ConnectionError, OSError, h11.LocalProtocolError):
            pass
        except asyncio.CancelledError:
            # Only `stop` and an eviction cancel a connection; ending normally keeps asyncio's stream callback
            # (3.11) from logging the cancellation as an unhandled error.
            cut = True
        finally:
            self._connections.discard(task)
            if self.slots is not None:
                self.slots.remove(task)
            if cut:
                writer.transport.abort()
            else:
                stream.close()
                try:  # a peer that reads nothing cannot hold the connection (or `stop`) open
                    await asyncio.wait_for(stream.wait_closed(), CLOSE_TIMEOUT)
                except (TimeoutError, OSError, asyncio.CancelledError):
                    writer.transport.abort()
            if self.on_connection_closed is not None:
                self.on_connection_closed()

    def _admit(self, task: asyncio.Task[None], peer: str | None) -> bool:
        """Take a connection slot for `task` (closing a connection it replaces); False when refused."""
        if self.slots is None:
            return True
        decision = self.slots.admit(task, peer)
        if decision.evict is not None:
            decision.evict.cancel()
        if not decision.admitted:
            self.on_malformed(peer, "no connection slot free")
        return decision.admitted

    async def _serve_stream(self, reader: _Reader, writer: _Writer, task: asyncio.Task[None]) -> bool:
        """Answer the connection's requests until it ends; True when it must be dropped without a goodbye."""
        loop = asyncio.get_running_loop()
        conn = ServerConnection(loop.time(), _peer_host(writer), self.limits, self.head_check)
        while True:
            try:
                request = conn.next_request()
            except Malformed as exc:
                self.on_malformed(conn.remote, exc.reason)
                writer.write(self._refusal(exc))
                await self._drain(writer)
                return False
            if isinstance(request, h11.ConnectionClosed):
                return False
            if request is None:
                wait = conn.deadline() - loop.time()
                if wait <= 0:
                    if conn.mid_request:  # slow or stalled client: told, then dropped
                        writer.write(self._refusal(Malformed("request not received in time", 408)))
                    return False
                writer.write(conn.interim())
                try:
                    data = await asyncio.wait_for(reader.read(READ_SIZE), wait)
                except TimeoutError:
                    continue
                conn.receive(data, loop.time())
                continue
            if self.slots is not None:
                self.slots.set_busy(task, True)
            try:
                answered = await self._answer(conn, writer, request)
            except TimeoutError:
                return True  # the client stopped reading the answer
            if self.slots is not None:
                self.slots.set_busy(task, False)
                self.slots.served(task)
            if not answered or not conn.next_cycle(loop.time()):
                return False

    def _refusal(self, exc: Malformed) -> bytes:
        if self.render_error is None:
            return error_bytes(exc.status, exc.reason)
        response = self.render_error(exc)
        content_type = next((v for k, v in response.headers if k.lower() == "content-type"), "text/plain")
        extra = [(k, v) for k, v in response.headers if k.lower() != "content-type"]
        return error_bytes(exc.status, exc.reason, body=response.body, content_type=content_type, headers=extra)

    async def _drain(self, writer: _Writer) -> None:
        """Wait for the client to take what was written (TimeoutError after `write_timeout`)."""
        transport = writer.transport
        if self.limits.write_timeout is None or transport.get_write_buffer_size() <= \
                transport.get_write_buffer_limits()[1]:
            await writer.drain()  # below the high-water mark: returns at once, no deadline needed
        else:
            await asyncio.wait_for(writer.drain(), self.limits.write_timeout)

    async def _answer(self, conn: ServerConnection, writer: _Writer, request: Request) -> bool:
        """Run the handler and send its answer; False when the connection cannot carry another request."""
        handler = self.router.resolve(request.method, request.path, request.target)
        if isinstance(handler, Response):
            response = handler
        else:
            try:
                response = await handler(request)
            except Exception:
                log.exception("HTTP server: error handling %s %s", request.method, request.path)
                response = text_response(500, INTERNAL_ERROR)
        try:
            return await self._send(conn, writer, request, response)
        except TimeoutError:
            raise
        except OSError:
            return False
        except Exception:  # a streamed body failed after its headers went out: the answer can only be cut
            log.exception("HTTP server: error sending the answer to %s %s", request.method, request.path)
            return False

    async def _send(self, conn: ServerConnection, writer: _Writer, request: Request,
                    response: Response) -> bool:
        stream, body = response.stream, response.body
        headers = list(response.headers)
        compressor = zlib.compressobj(wbits=16 + zlib.MAX_WBITS) if response.gzip else None
        if compressor is not None:
            headers.append(("Content-Encoding", "gzip"))
        try:
            if stream is None:
                if compressor is not None:
                    body = compressor.compress(body) + compressor.flush()
                headers.append(("Content-Length", str(len(body))))
            writer.write(conn.start_response(response.status, headers))
            if request.method == "HEAD":
                writer.write(conn.end_response())
                await self._drain(writer)
                return True
            if stream is None:
                writer.write(conn.send_body(body))
            else:
                async for chunk in stream:
                    data = compressor.compress(chunk) if compressor is not None else chunk
                    if data:
                        writer.write(conn.send_body(data))
                        await self._drain(writer)
                if compressor is not None:
                    writer.write(conn.send_body(compressor.flush()))
            writer.write(conn.end_response())
            await self._drain(writer)
            return True
        finally:
            if stream is not None:
                await stream.aclose()
