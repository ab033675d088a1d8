"""The app prober's I/O edge: HTTP(S), TCP and gRPC health probes, and the :15020 routes that run them.

The rules (which request, which redirect to follow, what to answer) live in
`rules`; this module only opens connections. Each probe gets a fresh
connection (no keep-alive, like the kubelet, so an idle timeout in the app can
never fail a probe) and the probe's whole time budget covers connecting,
redirects and reading the body. Any failure to get an answer is a 500 with an
empty body; the reason goes to the `probes` log, which is about the app, not
the agent.

HTTP probes are HTTP/1.1 on h11 (no h2c, as upstream). HTTPS probes offer
HTTP/2 through ALPN unless ISTIO_ENABLE_HTTP2_PROBING is off, when they are
HTTP/1.1 and offer no ALPN, as upstream's transport without HTTP/2 configured.
Both go through `https`, loaded on the first HTTP probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import grpc

from istio_agent.httpio.routing import Router
from istio_agent.httpio.server_core import Request, Response, text_response
from istio_agent.netaddr import join_host_port
from istio_agent.status.probes.rules import (
    PROBE_SOURCE_V6,
    PROBE_USER_AGENT,
    Answer,
    AppProbe,
    Fail,
    Follow,
    GrpcAction,
    HttpGetAction,
    ProbeOptions,
    TcpSocketAction,
    next_step,
    probe_url,
    request_headers,
    source_address,
    target_host,
)

if TYPE_CHECKING:
    from istio_agent.status.probes.https import HttpsProber

log = logging.getLogger("istio_agent.probes")

HEALTH_CHECK_METHOD = "/grpc.health.v1.Health/Check"


@dataclass(frozen=True)
class ProbeResult:
    status: int
    body: bytes = b""
    content_type: str | None = None
    reason: str = ""  # why there was no answer (a 500 of the prober's own); the workload health checker reports it


class Reply(Protocol):
    """An app's answer as the prober reads it, whichever HTTP client got it."""

    status: int

    def header(self, name: str) -> str | None: ...

    async def read(self, size: int) -> bytes: ...


# ---- the prober ------------------------------------------------------------------------------------------


class AppProber:
    """Runs one probe at a time per request.

    By default it holds no connection between probes (upstream disables keep-alives, as the
    kubelet does); with `keepalive` (ENABLE_PROBE_KEEPALIVE_CONNECTIONS) HTTP connections are
    kept per source address and reused by later probes.
    """

    def __init__(self, options: ProbeOptions) -> None:
        self.options = options
        self._v6_source_ok: bool | None = None
        self._https_prober: HttpsProber | None = None

    async def close(self) -> None:
        if self._https_prober is not None:
            await self._https_prober.close()

    def _bindable(self, source: str | None) -> str | None:
        """::6 exists only where the pod set it up (127.0.0.6 is always local); fall back to no bind."""
        if source != PROBE_SOURCE_V6:
            return source
        if self._v6_source_ok is None:
            try:
                with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
                    sock.bind((PROBE_SOURCE_V6, 0))
                self._v6_source_ok = True
            except OSError as exc:
                self._v6_source_ok = exc.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)
        return source if self._v6_source_ok else None

    def _source(self, destination: str) -> str | None:
        if not self.options.bind_probe_source:
            return None
        return self._bindable(source_address(destination, self.options.pod_ip))

    async def probe(self, probe: AppProbe, headers: Iterable[tuple[str, str]] = (),
                    host: str | None = None) -> ProbeResult:
        """Probe the app; the answer's status is what the status server returns to the kubelet."""
        action = probe.action
        try:
            async with asyncio.timeout(probe.timeout):
                if isinstance(action, HttpGetAction):
                    return await self._http(probe, action, list(headers), host)
                if isinstance(action, TcpSocketAction):
                    return await self._tcp(action)
                return await self._grpc(probe, action)
        except TimeoutError:
            log.info("probe %s: no answer within %gs", probe.path, probe.timeout)
            return ProbeResult(500, reason=f"no answer within {probe.timeout:g}s")

    def _http_client(self) -> HttpsProber:
        # Imported on the first HTTP probe, not at agent start: many pods have none.
        if self._https_prober is None:
            from istio_agent.status.probes.https import HttpsProber

            self._https_prober = HttpsProber(self.options.keepalive, alpn=self.options.http2)
        return self._https_prober

    @contextlib.asynccontextmanager
    async def _get(self, url: str, headers: list[tuple[str, str]], host: str | None,
                   source: str | None) -> AsyncIterator[Reply]:
        """One GET: HTTP/1.1, or HTTPS with HTTP/2 offered unless it is off (`https`)."""
        async with self._http_client().get(url, headers, host, source) as reply:
            yield reply

    async def _http(self, probe: AppProbe, action: HttpGetAction, incoming: list[tuple[str, str]],
                    incoming_host: str | None) -> ProbeResult:
        first = url = probe_url(action, self.options.pod_ip)
        headers, host = request_headers(action, incoming, incoming_host, self.options.status_port)
        source = self._source(target_host(action, self.options.pod_ip))
        requests = 0
        try:
            while True:
                requests += 1
                async with self._get(url, headers, host, source) as reply:
                    step = next_step(reply.status, reply.header("Location"), url, first, requests, host)
                    if isinstance(step, Follow):
                        url, host = step.url, step.host
                        continue
                    if isinstance(step, Fail):
                        log.info("probe %s: %s", probe.path, step.reason)
                        return ProbeResult(500, reason=step.reason)
                    return await self._answer(step, reply)
        except (OSError, ValueError) as exc:
            reason = f"request to {url} failed: {exc or type(exc).__name__}"
            log.info("probe %s: %s", probe.path, reason)
            return ProbeResult(500, reason=reason)

    async def _answer(self, step: Answer, reply: Reply) -> ProbeResult:
        if not step.pass_body:
            return ProbeResult(step.status)
        body = bytearray()
        cap = self.options.max_body_bytes
        while len(body) < cap:
            chunk = await reply.read(cap - len(body))
            if not chunk:
                break
            body += chunk
        return ProbeResult(step.status, bytes(body), reply.header("Content-Type"))

    async def _tcp(self, action: TcpSocketAction) -> ProbeResult:
        host = target_host(action, self.options.pod_ip)
        source = self._source(host)
        try:
            _, writer = await asyncio.open_connection(
                host.strip("[]"), action.port, local_addr=(source, 0) if source else None)
        except OSError as exc:
            reason = f"connecting to {join_host_port(host, action.port)} failed: {exc}"
            log.info("tcp probe: %s", reason)
            return ProbeResult(500, reason=reason)
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass
        return ProbeResult(200)

    async def _grpc(self, probe: AppProbe, action: GrpcAction) -> ProbeResult:
        # Imported on the first gRPC probe, not at agent start: most pods have none, and every
        # agent's resident memory counts. Only the messages: the generated stub module insists
        # on a grpcio at least as new as the one it was generated with.
        from grpc_health.v1 import health_pb2

        target = join_host_port(self.options.pod_ip, action.port)
        options = [("grpc.primary_user_agent", PROBE_USER_AGENT), ("grpc.enable_retries", 0)]
        async with grpc.aio.insecure_channel(target, options=options) as channel:
            check = channel.unary_unary(
                HEALTH_CHECK_METHOD, request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                response_deserializer=health_pb2.HealthCheckResponse.FromString)
            try:
                response = await check(health_pb2.HealthCheckRequest(service=action.service), timeout=probe.timeout)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    reason = f"{target} does not implement grpc.health.v1.Health"
                else:
                    reason = f"gRPC health check of {target} failed: {exc.code().name} {exc.details()}"
                log.info("probe %s: %s", probe.path, reason)
                return ProbeResult(500, reason=reason)
        if response.status == health_pb2.HealthCheckResponse.SERVING:
            return ProbeResult(200)
        reason = f"service {action.service!r} on {target} is not SERVING (status {response.status})"
        log.info("probe %s: %s", probe.path, reason)
        return ProbeResult(500, reason=reason)


# ---- routes -----------------------------------------------------------------------------------------------


def add_probe_routes(app: Router, options: ProbeOptions) -> None:
    """Serve `/app-health/...` and `/app-lifecycle/...` (any method) on the status server; unknown paths answer 400."""
    prober = AppProber(options)

    async def handle(request: Request) -> Response:
        path = request.path
        probe = options.probers.get(path)
        if probe is None:
            log.warning("no app probe configured for %s", path)
            return text_response(400, f"app prober config does not exists for {path}")
        result = await prober.probe(probe, request.headers, request.header("Host"))
        headers = [("Content-Type", result.content_type)] if result.content_type and result.body else []
        return Response(result.status, result.body, headers)

    app.add("/app-health/", handle, prefix=True)
    app.add("/app-lifecycle/", handle, prefix=True)
    app.on_close(prober.close)
