"""install-cni's three small HTTP servers: health (:8000), metrics (--monitoring-port), the plugin's log socket.

HTTP/1.1 with h11 over asyncio streams rather than aiohttp: this process runs on
every node and idles nearly always; h11 adds ~0.5 MB to the interpreter where
aiohttp's server adds ~17 MB and 200 ms of imports (README). Each server answers
a handful of fixed paths, keeps connections alive and caps request bodies.

- health: `/healthz` 200 always, `/readyz` 200 while `Readiness.ready`, else 503;
- metrics: `/metrics`, the registry in Prometheus' text format (upstream's path);
- log socket: POST `/log` from the plugin (`pluginlog` parses it), each line
  logged under the plugin's logger with the plugin's time and labels; the
  socket file is made 0666 as upstream does, so a plugin of any uid can post.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import h11

from istio_agent.cni.install.pluginlog import PluginLogError, parse_body

log = logging.getLogger("istio_agent.cni.install")
plugin_log = logging.getLogger("istio_agent.cni.plugin")

MAX_BODY = 4 << 20
Handler = Callable[[str, str, bytes], Awaitable[tuple[int, str, bytes]]]


@dataclass
class Readiness:
    """What /readyz reports: installed, and our entry still in effect."""

    ready: bool = False


async def _serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler) -> None:
    conn = h11.Connection(h11.SERVER)
    try:
        while True:
            request: h11.Request | None = None
            body = bytearray()
            too_large = False
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await reader.read(65536)
                    conn.receive_data(data)
                    if not data and conn.their_state is not h11.DONE:
                        return
                    continue
                if isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.Data):
                    if len(body) + len(event.data) > MAX_BODY:
                        too_large = True
                    else:
                        body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    return
            assert request is not None
            target = request.target.decode("latin-1").split("?", 1)[0]
            if too_large:
                status, content_type, payload = 413, "text/plain; charset=utf-8", b"Request Entity Too Large\n"
            else:
                status, content_type, payload = await handler(request.method.decode("latin-1"), target, bytes(body))
            headers = [("content-type", content_type), ("content-length", str(len(payload)))]
            writer.write(conn.send(h11.Response(status_code=status, headers=headers)) or b"")
            writer.write(conn.send(h11.Data(data=payload)) or b"")
            writer.write(conn.send(h11.EndOfMessage()) or b"")
            await writer.drain()
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()
    except (h11.RemoteProtocolError, h11.LocalProtocolError):
        with contextlib.suppress(Exception):
            writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def _text(status: int, text: str) -> tuple[int, str, bytes]:
    return status, "text/plain; charset=utf-8", text.encode()


def health_handler(readiness: Readiness) -> Handler:
    async def handle(method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        if path == "/healthz":
            return _text(200, "")
        if path == "/readyz":
            return _text(200, "") if readiness.ready else _text(503, "Service Unavailable\n")
        return _text(404, "404 page not found\n")
    return handle


def metrics_handler(registry: object) -> Handler:
    from prometheus_client import exposition

    async def handle(method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        if path != "/metrics":
            return _text(404, "404 page not found\n")
        return 200, exposition.CONTENT_TYPE_LATEST, exposition.generate_latest(registry)  # type: ignore[arg-type]
    return handle


def emit_plugin_lines(body: bytes) -> int:
    """Log each usable line of a POST /log body under the plugin's logger; how many were logged."""
    try:
        lines = parse_body(body)
    except PluginLogError as exc:
        log.error("%s", exc)
        return 0
    for line in lines:
        if not plugin_log.isEnabledFor(line.level):
            continue
        record = plugin_log.makeRecord(plugin_log.name, line.level, "(istio-cni)", 0, "%s", (line.text(),), None)
        record.created = line.time
        record.msecs = (line.time - int(line.time)) * 1000
        plugin_log.handle(record)
    return len(lines)


def log_handler() -> Handler:
    async def handle(method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        if path != "/log":
            return _text(404, "404 page not found\n")
        emit_plugin_lines(body)
        return _text(200, "")
    return handle


class Servers:
    """The servers started, for stopping them together."""

    def __init__(self) -> None:
        self._servers: list[asyncio.base_events.Server] = []
        self._socket_path: str | None = None
        self._connections: set[asyncio.Task[None]] = set()

    def _on_connection(self, handler: Handler) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter],
                                                           Awaitable[None]]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            self._connections.add(task)
            try:
                await _serve_connection(reader, writer, handler)
            finally:
                self._connections.discard(task)
        return serve

    async def start_tcp(self, port: int, handler: Handler, host: str | None = None) -> int:
        """Listen on `port` on every address (upstream's `:port`); the port bound (for port 0)."""
        server = await asyncio.start_server(self._on_connection(handler), host=host, port=port, reuse_address=True)
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def start_unix(self, path: str, handler: Handler) -> None:
        """Listen on a unix socket at `path` (a stale one removed, its directory made, the socket 0666)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            Path(path).parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        server = await asyncio.start_unix_server(self._on_connection(handler), path=path)
        os.chmod(path, 0o666)
        self._servers.append(server)
        self._socket_path = path

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._connections):
            task.cancel()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)
        if self._socket_path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._socket_path)
        self._servers.clear()
