"""install-cni's three small HTTP servers: health (:8000), metrics (--monitoring-port), the plugin's log socket.

HTTP/1.1 with h11 over asyncio streams rather than aiohttp: this process runs on
every node and idles nearly always; h11 adds ~0.5 MB to the interpreter where
aiohttp's server adds ~17 MB and 200 ms of imports (docs/CNI.md, Footprint). Each server is the
agent's shared `httpio` server with one catch-all route: a handful of fixed
paths, connections kept alive, request bodies capped (4 MiB, 413 beyond), and
the same refusals of non-HTTP input and slow clients as the status server.

- health: `/healthz` 200 always, `/readyz` 200 while installed and in effect as the files are now
  (`Readiness.now`), else 503;
- metrics: `/metrics`, the registry in Prometheus' text format 0.0.4 (upstream's path; `istio_agent.metrics`);
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

from istio_agent.cni.install.pluginlog import PluginLogError, parse_body
from istio_agent.httpio.routing import Router
from istio_agent.httpio.server import HttpServer
from istio_agent.httpio.server_core import Limits, Request, Response
from istio_agent.metrics.core import Collector
from istio_agent.metrics.exposition import TEXT_CONTENT_TYPE, generate_latest

log = logging.getLogger("istio_agent.cni.install")
plugin_log = logging.getLogger("istio_agent.cni.plugin")

MAX_BODY = 4 << 20
Handler = Callable[[str, str, bytes], Awaitable[tuple[int, str, bytes]]]


@dataclass
class Readiness:
    """What /readyz reports: installed (the installer loop's last round), and still in effect now.

    `check` is asked on every /readyz (the installer's look at the files as they are): a writer that took
    our entry out makes /readyz 503 at once, not only once the loop has seen the change and put it back.
    """

    ready: bool = False
    check: Callable[[], bool] | None = None

    def now(self) -> bool:
        if not self.ready:
            return False
        if self.check is None:
            return True
        try:
            return self.check()
        except Exception:  # a look that fails is no proof of readiness
            return False


def _text(status: int, text: str) -> tuple[int, str, bytes]:
    return status, "text/plain; charset=utf-8", text.encode()


def health_handler(readiness: Readiness) -> Handler:
    async def handle(method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        if path == "/healthz":
            return _text(200, "")
        if path == "/readyz":
            return _text(200, "") if readiness.now() else _text(503, "Service Unavailable\n")
        return _text(404, "404 page not found\n")
    return handle


def metrics_handler(registry: Collector) -> Handler:
    async def handle(method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        if path != "/metrics":
            return _text(404, "404 page not found\n")
        return 200, TEXT_CONTENT_TYPE, generate_latest(registry)
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
        self._servers: list[HttpServer] = []
        self._socket_path: str | None = None

    @staticmethod
    def _http(handler: Handler) -> HttpServer:
        async def route(request: Request) -> Response:
            status, content_type, payload = await handler(request.method, request.path, request.body)
            return Response(status, payload, [("content-type", content_type)])

        router = Router()
        router.add("", route, prefix=True)  # every path: the handler answers its own 404s
        return HttpServer(router, limits=Limits(max_body_bytes=MAX_BODY))

    async def start_tcp(self, port: int, handler: Handler, host: str | None = None) -> int:
        """Listen on `port` on every address (upstream's `:port`); the port bound (for port 0)."""
        server = self._http(handler)
        bound = await server.start(host, port)
        self._servers.append(server)
        return bound

    async def start_unix(self, path: str, handler: Handler) -> None:
        """Listen on a unix socket at `path` (a stale one removed, its directory made, the socket 0666)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            Path(path).parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        server = self._http(handler)
        await server.start_unix(path)
        os.chmod(path, 0o666)
        self._servers.append(server)
        self._socket_path = path

    async def stop(self) -> None:
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.stop(), 2)
        if self._socket_path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._socket_path)
        self._servers.clear()
