"""Peers for the merged-metrics tests: a fake Envoy page, misbehaving apps, a real prometheus_client
app, a real Envoy, and the checkers (promtool, prometheus_client's parsers). No tests here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from aiohttp import web
from needs import need, need_tool
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text
from support import ENVOY, HTTP_NOT_YET, envoy_stats_bootstrap, free_port, http_request, poll, stop_process

from istio_agent import metrics as agent_metrics
from istio_agent.httpio.routing import Router
from istio_agent.httpio.server import HttpServer
from istio_agent.status.agent_metrics import AgentMetrics
from istio_agent.status.merged_metrics.handler import MergedMetricsHandler, MetricsOptions

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
TEXT_ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
OM_TYPE = "application/openmetrics-text"


def envoy_page(clusters: int = 20) -> bytes:
    """Text the way Envoy writes it: TYPE lines only, counters with and without `_total`, `{}` labels."""
    names = [f"outbound|80||svc-{i}.default.svc.cluster.local" for i in range(clusters)]
    out = []
    for stat in ("assignment_stale", "upstream_cx_total", "upstream_rq", "upstream_rq_retry", "upstream_rq_total"):
        out.append(f"# TYPE envoy_cluster_{stat} counter")
        out += [f'envoy_cluster_{stat}{{envoy_cluster_name="{n}"}} {i}' for i, n in enumerate(names)]
    out.append("# TYPE envoy_cluster_membership_healthy gauge")
    out += [f'envoy_cluster_membership_healthy{{envoy_cluster_name="{n}"}} 1' for n in names]
    out.append("# TYPE envoy_server_live gauge\nenvoy_server_live{} 1")
    out.append("# TYPE envoy_cluster_upstream_cx_connect_ms histogram")
    for n in names:
        for le in ("0.5", "1", "5", "25", "+Inf"):
            out.append(f'envoy_cluster_upstream_cx_connect_ms_bucket{{envoy_cluster_name="{n}",le="{le}"}} 2')
        out.append(f'envoy_cluster_upstream_cx_connect_ms_sum{{envoy_cluster_name="{n}"}} 3.5')
        out.append(f'envoy_cluster_upstream_cx_connect_ms_count{{envoy_cluster_name="{n}"}} 2')
    return ("\n".join(out) + "\n").encode()


async def serve(app: web.Application, host: str = "127.0.0.1") -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    return runner, int(runner.addresses[0][1])


class Peer:
    """One loopback HTTP server playing Envoy and/or misbehaving apps; `release` ends every hang."""

    def __init__(self, page: bytes) -> None:
        self.page = page
        self.envoy_mode = "ok"
        self.queries: list[str] = []
        self.release = asyncio.Event()
        self.app = web.Application()
        self.app.router.add_get("/stats/prometheus", self.envoy)
        self.flips = 0
        for name in ("text", "flip", "500", "html", "json", "hang", "stall", "protobuf", "huge", "declared"):
            self.app.router.add_get(f"/{name}", getattr(self, f"app_{name}"))
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self._runner, self.port = await serve(self.app)

    async def stop(self) -> None:
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _hang(self) -> web.Response:
        await self.release.wait()
        return web.Response(status=503)

    async def _huge(self, request: web.Request, size: int, declared: bool) -> web.StreamResponse:
        # ~16 KiB families with distinct names (NNNNNN), so that the page itself is valid.
        template = b"# TYPE huge_series_NNNNNN gauge\n" + b"".join(
            b'huge_series_NNNNNN{i="%03d",pad="' % i + b"x" * 60 + b'"} 1\n' for i in range(160))
        count = size // len(template)
        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=UTF-8"})
        if declared:
            response.content_length = count * len(template)
        await response.prepare(request)
        for index in range(count):
            await response.write(template.replace(b"NNNNNN", b"%06d" % index))
        await response.write_eof()
        return response

    async def envoy(self, request: web.Request) -> web.StreamResponse:
        self.queries.append(request.query_string)
        if self.envoy_mode == "hang":
            return await self._hang()
        if self.envoy_mode == "huge":
            return await self._huge(request, 11 * 1024 * 1024, declared=False)
        if self.envoy_mode == "declared":
            return await self._huge(request, 11 * 1024 * 1024, declared=True)
        return web.Response(body=self.page, headers={"Content-Type": "text/plain; charset=UTF-8"})

    async def app_text(self, _request: web.Request) -> web.Response:
        return web.Response(body=b"# TYPE second_app_up gauge\nsecond_app_up 1\n",
                            headers={"Content-Type": "text/plain; version=0.0.4"})

    async def app_flip(self, _request: web.Request) -> web.Response:
        """OpenMetrics, then text, then OpenMetrics ...: an app whose format changes between scrapes."""
        self.flips += 1
        if self.flips % 2:
            return web.Response(body=b"# HELP flip_events Events.\n# TYPE flip_events counter\n"
                                     b"flip_events_total 4.0\nflip_events_created 1.7e+09\n# EOF\n",
                                headers={"Content-Type": "application/openmetrics-text; version=1.0.0; charset=utf-8"})
        return web.Response(body=b"# HELP flip_events_total Events.\n# TYPE flip_events_total counter\n"
                                 b"flip_events_total 4.0\n# HELP flip_events_created Events.\n"
                                 b"# TYPE flip_events_created gauge\nflip_events_created 1.7e+09\n",
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def app_500(self, _request: web.Request) -> web.Response:
        return web.Response(status=500, text="boom: SECRET-STACK-TRACE in handler")

    async def app_html(self, _request: web.Request) -> web.Response:
        return web.Response(text="<html><body>SECRET-STACK-TRACE</body></html>\n", content_type="text/plain")

    async def app_json(self, _request: web.Request) -> web.Response:
        return web.Response(text='{"error": "SECRET-STACK-TRACE"}\n', content_type="application/json")

    async def app_hang(self, _request: web.Request) -> web.Response:
        return await self._hang()

    async def app_stall(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain; version=0.0.4"})
        await response.prepare(request)
        await response.write(b"# TYPE stalled_first gauge\nstalled_first 1\n# TYPE stalled_second gauge\n")
        await self.release.wait()
        return response

    async def app_protobuf(self, _request: web.Request) -> web.Response:
        return web.Response(body=b"\x08\x01SECRET-STACK-TRACE", headers={
            "Content-Type": "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; "
                            "encoding=delimited"})

    async def app_huge(self, request: web.Request) -> web.StreamResponse:
        return await self._huge(request, 11 * 1024 * 1024, declared=False)

    async def app_declared(self, request: web.Request) -> web.StreamResponse:
        return await self._huge(request, 11 * 1024 * 1024, declared=True)


def app_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("app_requests", "Requests served.", ["code"], registry=registry).labels("200").inc(3)
    Gauge("app_inflight", "In flight.", registry=registry).set(2)
    Histogram("app_latency_seconds", "Latency.", registry=registry).observe(0.2)
    return registry


@contextlib.contextmanager
def prometheus_client_app(registry: CollectorRegistry | None = None) -> Iterator[int]:
    """prometheus_client's own HTTP exposition server (OpenMetrics when asked), on a loopback port."""
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry or app_registry())
    try:
        yield int(server.server_port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextlib.asynccontextmanager
async def merged_endpoint(options: MetricsOptions) -> AsyncIterator[tuple[int, MergedMetricsHandler]]:
    """The status server's HTTP server with only the merged routes and an agent registry."""
    registry = agent_metrics.CollectorRegistry(auto_describe=True)
    AgentMetrics(registry)
    router = Router()
    handler = MergedMetricsHandler(options, registry)
    handler.add_routes(router)
    server = HttpServer(router)
    port = await server.start("127.0.0.1", 0)
    try:
        yield port, handler
    finally:
        await server.stop()


def promtool(body: bytes) -> tuple[int, str]:
    """`promtool check metrics`: 0 = clean, 3 = lint findings only, 1 = parse error."""
    tool = need_tool("promtool")
    done = subprocess.run([tool, "check", "metrics"], input=body, capture_output=True, timeout=60)
    return done.returncode, done.stderr.decode(errors="replace")[-2000:]


def assert_promtool_parses(body: bytes) -> None:
    code, err = promtool(body)
    assert code in (0, 3), f"promtool check metrics exit {code}: {err}"


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(body: bytes, content_type: str) -> Samples:
    parser = parse_om if content_type.startswith(OM_TYPE) else parse_text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parser(body.decode()) for s in family.samples}


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


# --- a real Envoy with a 15090-style listener -----------------------------------------------------------------


@contextlib.contextmanager
def real_envoy(clusters: int = 20) -> Iterator[int]:
    """Start the real Envoy; yield its stats listener port once `/stats/prometheus` answers."""
    need(ENVOY.exists(), f"needs the Envoy binary at {ENVOY}")
    admin_port, stats_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "envoy.json"
        config.write_text(json.dumps(envoy_stats_bootstrap(admin_port, stats_port, clusters)))
        log = (Path(tmp) / "envoy.log").open("wb")
        process = subprocess.Popen([str(ENVOY), "-c", str(config), "--disable-hot-restart", "-l", "error",
                                    "--base-id", str(stats_port)], stdout=log, stderr=subprocess.STDOUT)
        try:
            def serving() -> bool:
                if process.poll() is not None:
                    raise AssertionError(f"Envoy exited: {(Path(tmp) / 'envoy.log').read_text()[-2000:]}")
                return http_request("127.0.0.1", stats_port, "/stats/prometheus", timeout=2)[0] == 200

            poll(serving, "Envoy to serve its stats", 30, lambda: (Path(tmp) / "envoy.log").read_text()[-2000:],
                 retry_on=HTTP_NOT_YET)
            yield stats_port
        finally:
            stop_process(process)
            log.close()
