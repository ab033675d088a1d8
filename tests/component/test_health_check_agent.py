"""A real `pilot-agent proxy sidecar` running ProxyConfig's readinessProbe against a real app, reporting to a
real ADS server.

istiod-local signs the agent's certificate (CA_ADDR); its xDS goes to
`FakeAds` (a grpc.aio ADS server recording every request, from the XDS proxy
tests), because istiod-local's ADS session does not record health reports.
The test plays Envoy on the agent's XDS socket (DISABLE_ENVOY: no Envoy
readiness in the aggregate) and sends the LDS request after which the proxy
may report. Per probe kind (HTTP GET, TCP, exec, gRPC health): the app up
gives an empty HealthInformation request; the app stopped (or NOT_SERVING, or
the exec's file gone) gives one with an error detail after failureThreshold
probes; the app back an empty one after successThreshold; nothing else is
reported (only changes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from aiohttp import web
from fixtures import AgentStarter
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from launchers import IstiodLocal, agent_environment
from support import eventually, free_port
from test_proxyless_agent import base_env
from test_xds_proxy_ads import AdsClient, FakeAds

from istio_agent.protos import typeurls

NODE = "sidecar~127.0.0.1~vm-1.default~default.svc.cluster.local"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IstiodLocal]:
    """One istiod-local for the module, as the agents' CA only."""
    with IstiodLocal(tmp_path_factory.mktemp("istiod") / "state") as server:
        yield server


@pytest.fixture
def pod(ca: IstiodLocal) -> Iterator[Path]:
    # A short root keeps <pod>/etc/istio/proxy/XDS under the unix socket path limit.
    directory = Path(tempfile.mkdtemp(prefix="health-", dir="/tmp"))
    try:
        yield ca.pod_files(directory, service_account="vm", pod="vm-1")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class App:
    """A workload the probe watches: `up()` / `down()` change what the probe sees."""

    probe: dict[str, Any]
    broken: str  # a part of the unhealthy report's message

    async def up(self) -> None: ...

    async def down(self) -> None: ...

    async def close(self) -> None:
        await self.down()


class HttpApp(App):
    def __init__(self) -> None:
        self.port = free_port()
        self.probe = {"httpGet": {"path": "/ready", "port": self.port}, "failureThreshold": 2, "successThreshold": 2}
        self.broken = f"http://127.0.0.1:{self.port}/ready failed"
        self.runner: web.AppRunner | None = None
        self.user_agents: list[str] = []

    async def up(self) -> None:
        async def ready(request: web.Request) -> web.Response:
            self.user_agents.append(request.headers.get("User-Agent", ""))
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/ready", ready)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True).start()

    async def down(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


class TcpApp(App):
    def __init__(self) -> None:
        self.port = free_port()
        self.probe = {"tcpSocket": {"port": self.port}}
        self.broken = f"connecting to 127.0.0.1:{self.port} failed"
        self.server: asyncio.Server | None = None

    async def up(self) -> None:
        async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        self.server = await asyncio.start_server(accept, "127.0.0.1", self.port, reuse_address=True)

    async def down(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None


class ExecApp(App):
    def __init__(self, flag: Path) -> None:
        self.flag = flag
        self.probe = {"exec": {"command": ["test", "-f", str(flag)]}}
        self.broken = "command 'test' exited with status 1"

    async def up(self) -> None:
        self.flag.write_text("ready")

    async def down(self) -> None:
        self.flag.unlink(missing_ok=True)


class GrpcApp(App):
    def __init__(self) -> None:
        self.port = free_port()
        self.probe = {"grpc": {"port": self.port, "service": "echo"}}
        self.broken = "'echo'"
        self.health = health.aio.HealthServicer()
        self.server: grpc.aio.Server | None = None

    async def up(self) -> None:
        if self.server is None:
            self.server = grpc.aio.server()
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
            self.server.add_insecure_port(f"127.0.0.1:{self.port}")
            await self.server.start()
        await self.health.set("echo", health_pb2.HealthCheckResponse.SERVING)

    async def down(self) -> None:
        await self.health.set("echo", health_pb2.HealthCheckResponse.NOT_SERVING)

    async def close(self) -> None:
        if self.server is not None:
            await self.server.stop(None)


APPS: dict[str, Callable[[Path], App]] = {
    "http": lambda _: HttpApp(), "tcp": lambda _: TcpApp(), "exec": lambda d: ExecApp(d / "app-ready"),
    "grpc": lambda _: GrpcApp(),
}


@dataclass
class Reports:
    ads: FakeAds

    def all(self) -> list[tuple[bool, str]]:
        """(healthy, message) of each HealthInformation request, in order."""
        return [(not r.HasField("error_detail"), r.error_detail.message)
                for r in self.ads.requests_of(typeurls.HEALTH_INFO)]

    async def wait(self, count: int, what: str, output: Callable[[], str]) -> list[tuple[bool, str]]:
        try:
            return await eventually(lambda: len(self.all()) >= count and self.all(), what=what, timeout=30)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nreports: {self.all()}\nagent:\n{output()}") from None


@contextlib.asynccontextmanager
async def envoy_stream(socket: Path) -> AsyncIterator[AdsClient]:
    """Envoy's side of the XDS socket: a stream that has asked for LDS (the proxy reports only after it)."""
    await eventually(socket.exists, what="the agent's XDS socket", timeout=30)
    client = AdsClient(socket, delta=False)
    try:
        await client.subscribe(typeurls.LISTENER, NODE)
        await client.read()
        yield client
    finally:
        await client.close()


@pytest.mark.parametrize("kind", list(APPS))
async def test_probe_failure_and_recovery_reach_the_ads_server(
        kind: str, pod: Path, ca: IstiodLocal, start_agent: AgentStarter) -> None:
    app = APPS[kind](pod)
    ads = FakeAds({typeurls.LISTENER: []})
    await app.up()
    await ads.start()
    try:
        proxy_config = {"discoveryAddress": f"127.0.0.1:{ads.port}", "controlPlaneAuthPolicy": "NONE",
                        "statusPort": free_port(),
                        "readinessProbe": {"periodSeconds": 1, "timeoutSeconds": 1, **app.probe}}
        environment = agent_environment(
            pod="vm-1", service_account="vm", proxy_config=proxy_config, base=base_env(),
            CA_ADDR=ca.secure_address, DISABLE_ENVOY="true", PILOT_CERT_PROVIDER="istiod",
            PROXY_CONFIG_XDS_AGENT="false")
        environment["PROXY_CONFIG"] = json.dumps(proxy_config)
        agent = start_agent(pod, environment)
        reports = Reports(ads)
        async with envoy_stream(pod / "etc/istio/proxy/XDS"):
            assert await reports.wait(1, "the first report: healthy", agent.output) == [(True, "")]

            await app.down()
            got = await reports.wait(2, "an unhealthy report", agent.output)
            assert got[1][0] is False and app.broken in got[1][1], f"{got}\n{agent.output()}"

            await app.up()
            got = await reports.wait(3, "the healthy report", agent.output)
            assert got[2] == (True, ""), f"{got}\n{agent.output()}"
            await asyncio.sleep(1.2)  # more probes pass: still only the three changes
            assert reports.all() == got[:3], agent.output()
        assert agent.alive(), agent.output()
        if isinstance(app, HttpApp):
            assert set(app.user_agents) == {"istio-probe/1.0"}
    finally:
        await app.close()
        await ads.stop()


async def test_envoy_not_ready_is_reported_first_then_the_app_decides(
        pod: Path, ca: IstiodLocal, start_agent: AgentStarter) -> None:
    """With Envoy, its readiness comes first: while Envoy is not up or has no listeners (istiod answers CDS, not
    LDS yet) the workload is unhealthy with Envoy's reason, though the app is up; LDS answered, the app's probe
    decides."""
    app = TcpApp()
    ads = FakeAds({typeurls.CLUSTER: []})  # LDS requests stay unanswered until the test answers them
    await app.up()
    await ads.start()
    try:
        proxy_config = {"discoveryAddress": f"127.0.0.1:{ads.port}", "controlPlaneAuthPolicy": "NONE",
                        "readinessProbe": {"periodSeconds": 1, **app.probe}}
        environment = agent_environment(
            pod="vm-1", service_account="vm", proxy_config=proxy_config, base=base_env(),
            CA_ADDR=ca.secure_address, PILOT_CERT_PROVIDER="istiod", PROXY_CONFIG_XDS_AGENT="false")
        agent = start_agent(pod, environment)
        reports = Reports(ads)
        first = await reports.wait(1, "Envoy's readiness as the first report", agent.output)
        # Envoy's reason, though the app is up: its admin API not answering yet, or no listeners from istiod.
        assert first[0][0] is False, first
        assert first[0][1].startswith(("Envoy's readiness stats could not be read", "config not received")), first
        assert ads.requests_of(typeurls.LISTENER), "the report came after Envoy's LDS request"

        ads.resources[typeurls.LISTENER] = []
        for stream in ads.streams:
            stream.subscribed.add(typeurls.LISTENER)
        ads.push(typeurls.LISTENER, [])
        got = await reports.wait(2, "healthy once Envoy has its listeners", agent.output)
        assert got[1] == (True, "")

        await app.down()
        got = await reports.wait(3, "the app's failure", agent.output)
        assert got[2][0] is False and app.broken in got[2][1], got
    finally:
        await app.close()
        await ads.stop()
