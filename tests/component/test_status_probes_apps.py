"""App probes through the status server's /app-health routes, against real apps on loopback.

The apps are real servers: aiohttp over HTTP and over TLS with a self-signed
certificate, a plain TCP listener, and a grpcio server with grpc_health's
servicer. The status routes run in the status server's own HTTP server
(`httpio`); requests go through real sockets the way the kubelet's would.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from conftest import VENV_BIN
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from support import free_port

from istio_agent.httpio.routing import Router
from istio_agent.httpio.server import HttpServer
from istio_agent.pki.certs import cert_to_pem, issue_server_cert, new_root_ca
from istio_agent.pki.keys import generate_key, key_to_pem
from istio_agent.status.probes.prober import add_probe_routes
from istio_agent.status.probes.rules import (
    MAX_BODY_BYTES,
    MAX_REQUESTS,
    ProbeOptions,
    parse_app_probers,
)

LOOPBACK = "127.0.0.1"


def bound_socket() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, 0))
    return sock


def closed_port() -> int:
    """A port nothing listens on (bound then released)."""
    return free_port()


@dataclass
class App:
    """The application's HTTP side: records what it was sent and answers as its state says."""

    port: int = 0
    tls_port: int = 0
    healthy: bool = True
    seen: list[dict[str, Any]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/echo", self.echo)
        app.router.add_get("/big", self.big)
        app.router.add_get("/slow", self.slow)
        app.router.add_get("/to-healthz", partial(self.redirect, location="/healthz"))
        app.router.add_get("/to-other-host", partial(self.redirect, location="http://other.invalid/login"))
        app.router.add_get("/loop", partial(self.redirect, location="/loop"))
        app.router.add_get("/to-tls", partial(self.redirect, location=f"https://{LOOPBACK}:{self.tls_port}/echo"))
        app.router.add_get("/not-modified", self.not_modified)
        app.router.add_get("/gzip", self.gzipped)

    def record(self, request: web.Request) -> None:
        self.seen.append({"path": request.path_qs, "headers": dict(request.headers), "remote": request.remote,
                          "tls": request.secure})

    async def healthz(self, request: web.Request) -> web.Response:
        self.record(request)
        if self.healthy:
            return web.Response(text="all good")
        return web.Response(status=503, text="not ready: warming caches")

    async def echo(self, request: web.Request) -> web.Response:
        self.record(request)
        return web.json_response({"headers": dict(request.headers), "remote": request.remote, "tls": request.secure})

    async def big(self, request: web.Request) -> web.Response:
        self.record(request)
        return web.Response(body=b"x" * (10 * MAX_BODY_BYTES), status=500)

    async def slow(self, request: web.Request) -> web.Response:
        self.record(request)
        await self.release.wait()
        return web.Response(text="late")

    async def redirect(self, request: web.Request, location: str) -> web.Response:
        self.record(request)
        return web.Response(status=302, headers={"Location": location})

    async def gzipped(self, request: web.Request) -> web.Response:
        self.record(request)
        response = web.Response(body=b"y" * (10 * MAX_BODY_BYTES), status=503)
        response.enable_compression(web.ContentCoding.gzip)
        return response

    async def not_modified(self, request: web.Request) -> web.Response:
        self.record(request)
        return web.Response(status=304)


@dataclass
class Grpc:
    port: int
    servicer: health.aio.HealthServicer


@dataclass
class Setup:
    app: App
    status_port: int
    tcp_port: int
    grpc: Grpc
    bare_grpc_port: int
    session: aiohttp.ClientSession

    async def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        async with self.session.get(f"http://{LOOPBACK}:{self.status_port}{path}", headers=headers) as response:
            return response.status, await response.read()


async def start(app: web.Application, sock: socket.socket, ssl_context: ssl.SSLContext | None = None) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
    await runner.setup()
    await web.SockSite(runner, sock, ssl_context=ssl_context).start()
    return runner


def tls_context(tmp_path: Path) -> ssl.SSLContext:
    now = time.time()
    ca = new_root_ca(generate_key("ECDSA"), "probe-test", now, 3600)
    key = generate_key("ECDSA")
    cert = issue_server_cert(ca, key, [], [LOOPBACK], now, 3600)
    (tmp_path / "cert.pem").write_text(cert_to_pem(cert))
    (tmp_path / "key.pem").write_bytes(key_to_pem(key))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    return context


def probers(app: App, tcp_port: int, grpc_port: int, bare_grpc_port: int) -> str:
    def http(path: str, **extra: Any) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": app.port, **extra}}

    return json.dumps({
        "/app-health/web/livez": http("/healthz"),
        "/app-health/web/readyz": {**http("/echo", httpHeaders=[{"name": "X-Probe", "value": "ready"}])},
        "/app-health/big/livez": http("/big"),
        "/app-health/slow/livez": {**http("/slow"), "timeoutSeconds": 1},
        "/app-health/redirect/livez": http("/to-healthz"),
        "/app-health/other-host/livez": http("/to-other-host"),
        "/app-health/loop/livez": http("/loop"),
        "/app-health/to-tls/livez": http("/to-tls"),
        "/app-health/not-modified/livez": http("/not-modified"),
        "/app-health/tls/livez": {"httpGet": {"path": "/echo", "port": app.tls_port, "scheme": "HTTPS"}},
        "/app-health/gzip/livez": http("/gzip"),
        "/app-health/tlsgzip/livez": {"httpGet": {"path": "/gzip", "port": app.tls_port, "scheme": "HTTPS"}},
        "/app-health/tlsbig/livez": {"httpGet": {"path": "/big", "port": app.tls_port, "scheme": "HTTPS"}},
        "/app-health/down/livez": {"httpGet": {"path": "/", "port": closed_port()}},
        "/app-health/db/readyz": {"tcpSocket": {"port": tcp_port}},
        "/app-health/db/livez": {"tcpSocket": {"port": closed_port()}},
        "/app-health/api/livez": {"grpc": {"port": grpc_port}},
        "/app-health/api/readyz": {"grpc": {"port": grpc_port, "service": "echo.Echo"}},
        "/app-health/api/startupz": {"grpc": {"port": grpc_port, "service": "unknown.Service"}},
        "/app-health/bare/livez": {"grpc": {"port": bare_grpc_port}},
        "/app-health/nogrpc/livez": {"grpc": {"port": closed_port()}},
        "/app-lifecycle/web/prestopz": http("/healthz"),
    })


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    app = App()
    runners: list[web.AppRunner] = []
    plain, secure = bound_socket(), bound_socket()
    app.port, app.tls_port = plain.getsockname()[1], secure.getsockname()[1]
    web_app = web.Application()
    app.routes(web_app)
    runners.append(await start(web_app, plain))
    runners.append(await start(web_app, secure, tls_context(tmp_path)))

    async def on_tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    tcp = await asyncio.start_server(on_tcp, LOOPBACK, 0)
    tcp_port = tcp.sockets[0].getsockname()[1]

    grpc_server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, grpc_server)
    grpc_port = grpc_server.add_insecure_port(f"{LOOPBACK}:0")
    await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    await servicer.set("echo.Echo", health_pb2.HealthCheckResponse.SERVING)
    await grpc_server.start()
    bare = grpc.aio.server()  # speaks gRPC but not grpc.health.v1
    bare_port = bare.add_insecure_port(f"{LOOPBACK}:0")
    await bare.start()

    status_port = free_port()
    options = ProbeOptions(probers=parse_app_probers(probers(app, tcp_port, grpc_port, bare_port)),
                           pod_ip=LOOPBACK, status_port=status_port)
    status_routes = Router()
    add_probe_routes(status_routes, options)
    status_server = HttpServer(status_routes)
    await status_server.start(LOOPBACK, status_port)
    session = aiohttp.ClientSession()
    try:
        yield Setup(app, status_port, tcp_port, Grpc(grpc_port, servicer), bare_port, session)
    finally:
        app.release.set()
        await session.close()
        await status_server.stop()
        for runner in reversed(runners):
            await runner.cleanup()
        tcp.close()
        await tcp.wait_closed()
        await grpc_server.stop(None)
        await bare.stop(None)


# ---- HTTP ------------------------------------------------------------------------------------------------


async def test_http_probe_follows_the_app_state(setup: Setup) -> None:
    assert await setup.get("/app-health/web/livez") == (200, b"all good")
    setup.app.healthy = False
    assert await setup.get("/app-health/web/livez") == (503, b"not ready: warming caches")
    setup.app.healthy = True
    assert (await setup.get("/app-health/web/livez"))[0] == 200
    assert (await setup.get("/app-lifecycle/web/prestopz"))[0] == 200


async def test_http_probe_headers_user_agent_host_and_source(setup: Setup) -> None:
    status, body = await setup.get("/app-health/web/readyz",
                                   headers={"User-Agent": "kube-probe/1.30", "X-Kubelet": "yes"})
    assert status == 200
    seen = json.loads(body)
    assert seen["headers"]["User-Agent"] == "kube-probe/1.30"  # the kubelet's, relayed as upstream does
    assert seen["headers"]["X-Probe"] == "ready"
    assert seen["headers"]["X-Kubelet"] == "yes"
    assert seen["headers"]["Host"] == f"{LOOPBACK}:{setup.app.port}"  # the status port swapped for the app's
    assert seen["remote"] == "127.0.0.6"  # upstream's probe source address, which capture rules let through


async def test_same_host_redirect_is_followed(setup: Setup) -> None:
    assert await setup.get("/app-health/redirect/livez") == (200, b"all good")
    assert [s["path"] for s in setup.app.seen] == ["/to-healthz", "/healthz"]
    setup.app.healthy = False
    assert (await setup.get("/app-health/redirect/livez"))[0] == 503


async def test_redirect_to_another_host_is_success_without_following(setup: Setup) -> None:
    assert await setup.get("/app-health/other-host/livez") == (200, b"")
    assert [s["path"] for s in setup.app.seen] == ["/to-other-host"]


async def test_redirect_loop_is_bounded(setup: Setup) -> None:
    assert (await setup.get("/app-health/loop/livez"))[0] == 500
    assert [s["path"] for s in setup.app.seen] == ["/loop"] * MAX_REQUESTS


async def test_other_3xx_answers_200(setup: Setup) -> None:
    assert await setup.get("/app-health/not-modified/livez") == (200, b"")


async def test_body_is_capped(setup: Setup) -> None:
    status, body = await setup.get("/app-health/big/livez")
    assert status == 500
    assert body == b"x" * MAX_BODY_BYTES


@pytest.mark.parametrize("scheme", ["", "tls"])
async def test_gzip_body_is_decoded_then_capped(setup: Setup, scheme: str) -> None:
    """Over HTTP and over HTTPS with HTTP/2 offered (this app selects no protocol): HTTP/1.1 on h11 either way."""
    assert await setup.get(f"/app-health/{scheme}gzip/livez") == (503, b"y" * MAX_BODY_BYTES)
    assert setup.app.seen[0]["headers"]["Accept-Encoding"] == "gzip, deflate"
    assert setup.app.seen[0]["tls"] is bool(scheme)


async def test_https_body_is_capped(setup: Setup) -> None:
    assert await setup.get("/app-health/tlsbig/livez") == (500, b"x" * MAX_BODY_BYTES)


async def test_timeout_fails_the_probe(setup: Setup) -> None:
    assert (await setup.get("/app-health/slow/livez"))[0] == 500
    assert [s["path"] for s in setup.app.seen] == ["/slow"]


async def test_https_probe_skips_verification(setup: Setup) -> None:
    status, body = await setup.get("/app-health/tls/livez")
    assert status == 200
    assert json.loads(body)["tls"] is True


async def test_redirect_to_https_on_the_same_host(setup: Setup) -> None:
    status, body = await setup.get("/app-health/to-tls/livez")
    assert status == 200
    assert json.loads(body)["tls"] is True
    assert [s["tls"] for s in setup.app.seen] == [False, True]


async def test_http_app_down_is_500(setup: Setup) -> None:
    assert await setup.get("/app-health/down/livez") == (500, b"")


# ---- TCP and gRPC ------------------------------------------------------------------------------------------


async def test_tcp_probe(setup: Setup) -> None:
    assert (await setup.get("/app-health/db/readyz"))[0] == 200
    assert (await setup.get("/app-health/db/livez"))[0] == 500


async def test_grpc_probe_follows_serving_status(setup: Setup) -> None:
    assert (await setup.get("/app-health/api/livez"))[0] == 200
    assert (await setup.get("/app-health/api/readyz"))[0] == 200
    await setup.grpc.servicer.set("echo.Echo", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert (await setup.get("/app-health/api/readyz"))[0] == 500
    assert (await setup.get("/app-health/api/livez"))[0] == 200
    await setup.grpc.servicer.set("echo.Echo", health_pb2.HealthCheckResponse.SERVING)
    assert (await setup.get("/app-health/api/readyz"))[0] == 200


async def test_grpc_probe_failures(setup: Setup) -> None:
    assert (await setup.get("/app-health/api/startupz"))[0] == 500  # unknown service: NOT_FOUND
    assert (await setup.get("/app-health/bare/livez"))[0] == 500  # no health service: UNIMPLEMENTED
    assert (await setup.get("/app-health/nogrpc/livez"))[0] == 500  # nothing listening


# ---- routing ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/app-health/nope/livez", "/app-health/web/livez/extra", "/app-lifecycle/x"])
async def test_unknown_probe_path_is_400(setup: Setup, path: str) -> None:
    status, body = await setup.get(path)
    assert status == 400
    assert path.encode() in body


def test_malformed_probers_fail_agent_start(tmp_path: Path) -> None:
    bad = json.dumps({"/app-health/web/livez": {"tcpSocket": {"port": "db"}}})
    done = subprocess.run([str(VENV_BIN / "pilot-agent"), "proxy", "sidecar"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={"ISTIO_KUBE_APP_PROBERS": bad, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1
    assert 'ISTIO_KUBE_APP_PROBERS["/app-health/web/livez"].tcpSocket.port' in done.stderr


@pytest.mark.parametrize(("keepalive", "connections"), [(False, 2), (True, 1)])
async def test_probe_connections_are_kept_only_with_probe_keepalive(keepalive: bool, connections: int) -> None:
    """ENABLE_PROBE_KEEPALIVE_CONNECTIONS: upstream closes each probe's connection unless it is set."""
    from aiohttp import web as aioweb

    from istio_agent.status.probes.prober import AppProber
    from istio_agent.status.probes.rules import AppProbe, HttpGetAction, ProbeOptions

    peers: list[object] = []

    async def ok(request: aioweb.Request) -> aioweb.Response:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        return aioweb.Response(text="ok")

    app = aioweb.Application()
    app.router.add_get("/ready", ok)
    runner = aioweb.AppRunner(app, access_log=None)
    await runner.setup()
    site = aioweb.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    prober = AppProber(ProbeOptions(pod_ip="127.0.0.1", keepalive=keepalive, bind_probe_source=False))
    probe = AppProbe("/app-health/app/readyz", HttpGetAction(port=port, path="/ready"), 1.0)
    try:
        for _ in range(2):
            assert (await prober.probe(probe)).status == 200
        assert len(set(map(str, peers))) == connections
    finally:
        await prober.close()
        await runner.cleanup()
