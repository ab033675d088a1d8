"""The asyncio edge of the HTTP/1.1 server: sockets in, `ServerConnection` decides, `Router` dispatches.

One task per connection reads with the connection's deadline, answers its
requests in order and writes each answer with backpressure (a streamed body is
sent as it is produced, gzip-compressed on the way when the response asks).
A refused request is answered, reported to `on_malformed` and its connection
closed; a handler that fails is logged and answered 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import Callable

import h11

from istio_agent.httpio.routing import Router
from istio_agent.httpio.server_core import (
    Limits,
    Malformed,
    Request,
    Response,
    ServerConnection,
    error_bytes,
    text_response,
)

log = logging.getLogger(__name__)

READ_SIZE = 65536
CLOSE_TIMEOUT = 2.0  # for the last bytes to leave, then the socket is dropped
INTERNAL_ERROR = "500 Internal Server Error\n\nServer got itself in trouble"


def _peer_host(writer: asyncio.StreamWriter) -> str | None:
    peer = writer.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else None


class HttpServer:
    """Serves `router` on one TCP address; `on_malformed(peer, reason)` hears of every refused request."""

    def __init__(self, router: Router, *, limits: Limits = Limits(),
                 on_malformed: Callable[[str | None, str], None] = lambda peer, reason: None) -> None:
        self.router = router
        self.limits = limits
        self.on_malformed = on_malformed
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, host: str | None, port: int, *, reuse_address: bool = True) -> int:
        """Listen; the port bound (for port 0)."""
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
        loop = asyncio.get_running_loop()
        conn = ServerConnection(loop.time(), _peer_host(writer), self.limits)
        try:
            while True:
                try:
                    request = conn.next_request()
                except Malformed as exc:
                    self.on_malformed(conn.remote, exc.reason)
                    writer.write(error_bytes(exc.status, exc.reason))
                    await writer.drain()
                    return
                if isinstance(request, h11.ConnectionClosed):
                    return
                if request is None:
                    wait = conn.deadline() - loop.time()
                    if wait <= 0:
                        if conn.mid_request:  # slow or stalled client: told, then dropped
                            writer.write(error_bytes(408, "request not received in time"))
                        return
                    writer.write(conn.interim())
                    try:
                        data = await asyncio.wait_for(reader.read(READ_SIZE), wait)
                    except TimeoutError:
                        continue
                    conn.receive(data, loop.time())
                    continue
                if not await self._answer(conn, writer, request) or not conn.next_cycle(loop.time()):
                    return
        except (ConnectionError, OSError, h11.LocalProtocolError):
            pass
        except asyncio.CancelledError:
            # Only `stop` cancels a connection; ending normally keeps asyncio's stream callback (3.11) from
            # logging the cancellation as an unhandled error.
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            try:  # a peer that reads nothing cannot hold the connection (or `stop`) open
                await asyncio.wait_for(writer.wait_closed(), CLOSE_TIMEOUT)
            except (TimeoutError, OSError, asyncio.CancelledError):
                writer.transport.abort()

    async def _answer(self, conn: ServerConnection, writer: asyncio.StreamWriter, request: Request) -> bool:
        """Run the handler and send its answer; False when the connection cannot carry another request."""
        handler = self.router.resolve(request.method, request.path)
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
        except OSError:
            return False
        except Exception:  # a streamed body failed after its headers went out: the answer can only be cut
            log.exception("HTTP server: error sending the answer to %s %s", request.method, request.path)
            return False

    async def _send(self, conn: ServerConnection, writer: asyncio.StreamWriter, request: Request,
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
                await writer.drain()
                return True
            if stream is None:
                writer.write(conn.send_body(body))
            else:
                async for chunk in stream:
                    data = compressor.compress(chunk) if compressor is not None else chunk
                    if data:
                        writer.write(conn.send_body(data))
                        await writer.drain()
                if compressor is not None:
                    writer.write(conn.send_body(compressor.flush()))
            writer.write(conn.end_response())
            await writer.drain()
            return True
        finally:
            if stream is not None:
                await stream.aclose()
