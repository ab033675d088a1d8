"""The XDS proxy against a real gRPC ADS server and a real gRPC ADS client over its UDS.

istiod-local's ADS server is not there yet, so `FakeAds` below is a small
grpc.aio server that speaks the real protocol (SotW and Delta, typed with the
Envoy protos): it answers each new subscription with a fixed set of resources,
records every request and the call metadata, and can push. The test client
is a grpc.aio ADS client on the proxy's socket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import message as pb_message
from support import eventually

from istio_agent.protos import nds_pb2, typeurls
from istio_agent.xds import XdsProxy, XdsProxyHooks, XdsProxyOptions
from istio_agent.xds.core import routing
from istio_agent.xds.upstream import UpstreamSettings

SOTW, DELTA = False, True
Request = Any  # a DiscoveryRequest or a DeltaDiscoveryRequest


# --- a minimal real ADS server ------------------------------------------------------------------------


@dataclass
class _FakeStream:
    delta: bool
    queue: asyncio.Queue[pb_message.Message | None] = field(default_factory=asyncio.Queue)
    subscribed: set[str] = field(default_factory=set)
    # Delta: names the client holds per type, so that a later response can remove the ones gone.
    known: dict[str, set[str]] = field(default_factory=dict)


class FakeAds:
    """An ADS server with fixed resources per type URL; answers new subscriptions, records everything."""

    def __init__(self, resources: dict[str, list[tuple[str, pb_message.Message]]]) -> None:
        self.resources = resources
        self.requests: list[tuple[bool, Request]] = []
        self.metadata: list[dict[str, str]] = []
        self.streams: list[_FakeStream] = []
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self._nonce = 0
        self.version = 1

    async def start(self, port: int = 0, credentials: grpc.ServerCredentials | None = None) -> int:
        server = grpc.aio.server(options=[("grpc.max_send_message_length", -1)])
        handlers = {
            "StreamAggregatedResources": grpc.stream_stream_rpc_method_handler(
                self._sotw,
                request_deserializer=discovery_pb2.DiscoveryRequest.FromString,
                response_serializer=discovery_pb2.DiscoveryResponse.SerializeToString,
            ),
            "DeltaAggregatedResources": grpc.stream_stream_rpc_method_handler(
                self._delta,
                request_deserializer=discovery_pb2.DeltaDiscoveryRequest.FromString,
                response_serializer=discovery_pb2.DeltaDiscoveryResponse.SerializeToString,
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(routing.ADS_SERVICE, handlers),))
        address = f"127.0.0.1:{port}"
        if credentials is None:
            self.port = server.add_insecure_port(address)
        else:
            self.port = server.add_secure_port(address, credentials)
        await server.start()
        self.server = server
        return self.port

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)
            self.server = None

    def requests_of(self, type_url: str, delta: bool | None = None) -> list[Any]:
        return [r for d, r in self.requests if r.type_url == type_url and (delta is None or d == delta)]

    def _response(self, type_url: str, stream: _FakeStream) -> pb_message.Message:
        self._nonce += 1
        nonce = f"nonce-{self._nonce}"
        if stream.delta:
            d = discovery_pb2.DeltaDiscoveryResponse(
                type_url=type_url, nonce=nonce, system_version_info=str(self.version)
            )
            for name, msg in self.resources[type_url]:
                r = d.resources.add(name=name, version=str(self.version))
                r.resource.Pack(msg)
            current = {name for name, _ in self.resources[type_url]}
            d.removed_resources.extend(sorted(stream.known.get(type_url, set()) - current))
            stream.known[type_url] = current
            return d
        s = discovery_pb2.DiscoveryResponse(type_url=type_url, nonce=nonce, version_info=str(self.version))
        for _, msg in self.resources[type_url]:
            s.resources.add().Pack(msg)
        return s

    def push(self, type_url: str, resources: list[tuple[str, pb_message.Message]]) -> None:
        """Replace a type's resources and send them to every stream subscribed to it."""
        self.version += 1
        self.resources[type_url] = resources
        for stream in self.streams:
            if type_url in stream.subscribed:
                stream.queue.put_nowait(self._response(type_url, stream))

    async def _sotw(self, _it: Any, context: grpc.aio.ServicerContext) -> None:
        await self._serve(context, SOTW)

    async def _delta(self, _it: Any, context: grpc.aio.ServicerContext) -> None:
        await self._serve(context, DELTA)

    async def _serve(self, context: grpc.aio.ServicerContext, delta: bool) -> None:
        stream = _FakeStream(delta)
        self.streams.append(stream)
        self.metadata.append({k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)})
        reader = asyncio.create_task(self._read(context, stream))
        try:
            while (item := await stream.queue.get()) is not None:
                await context.write(item)
        finally:
            reader.cancel()
            self.streams.remove(stream)

    async def _read(self, context: grpc.aio.ServicerContext, stream: _FakeStream) -> None:
        while (request := await context.read()) is not grpc.aio.EOF:
            assert isinstance(request, discovery_pb2.DiscoveryRequest | discovery_pb2.DeltaDiscoveryRequest)
            self.requests.append((stream.delta, request))
            if not request.response_nonce and request.type_url in self.resources:
                stream.subscribed.add(request.type_url)
                if stream.delta:  # a reconnecting Delta client says what it already holds
                    stream.known[request.type_url] = set(request.initial_resource_versions)
                stream.queue.put_nowait(self._response(request.type_url, stream))
        stream.queue.put_nowait(None)


def clusters(count: int, prefix: str = "svc") -> list[tuple[str, pb_message.Message]]:
    out: list[tuple[str, pb_message.Message]] = []
    for i in range(count):
        name = f"outbound|80||{prefix}-{i}.default.svc.cluster.local"
        c = cluster_pb2.Cluster(name=name, type=cluster_pb2.Cluster.STATIC)
        c.connect_timeout.seconds = 1
        c.load_assignment.cluster_name = name
        ep = c.load_assignment.endpoints.add().lb_endpoints.add().endpoint
        ep.address.socket_address.address = "127.0.0.1"
        ep.address.socket_address.port_value = 18080 + i % 1000
        out.append((name, c))
    return out


def name_table() -> nds_pb2.NameTable:
    table = nds_pb2.NameTable()
    info = table.table["echo.default.svc.cluster.local"]
    info.ips.append("10.96.0.20")
    info.registry, info.shortname, info.namespace = "Kubernetes", "echo", "default"
    return table


# --- a test ADS client on the proxy's socket ------------------------------------------------------------


class AdsClient:
    """One ADS stream to the proxy, typed with the Envoy protos."""

    def __init__(self, socket: Path, delta: bool) -> None:
        self.delta = delta
        self.channel = grpc.aio.insecure_channel(f"unix:{socket}")
        method = routing.DELTA_METHOD if delta else routing.SOTW_METHOD
        req_cls: Any = discovery_pb2.DeltaDiscoveryRequest if delta else discovery_pb2.DiscoveryRequest
        resp_cls: Any = discovery_pb2.DeltaDiscoveryResponse if delta else discovery_pb2.DiscoveryResponse
        self.call: Any = self.channel.stream_stream(
            method, request_serializer=req_cls.SerializeToString, response_deserializer=resp_cls.FromString
        )()

    async def subscribe(self, type_url: str, node_id: str = "") -> None:
        if self.delta:
            request: Any = discovery_pb2.DeltaDiscoveryRequest(type_url=type_url)
        else:
            request = discovery_pb2.DiscoveryRequest(type_url=type_url)
        if node_id:
            request.node.id = node_id
        await self.call.write(request)

    async def ack(self, response: Any) -> None:
        if self.delta:
            await self.call.write(discovery_pb2.DeltaDiscoveryRequest(type_url=response.type_url,
                                                                      response_nonce=response.nonce))
        else:
            await self.call.write(discovery_pb2.DiscoveryRequest(
                type_url=response.type_url, response_nonce=response.nonce, version_info=response.version_info))

    async def read(self, timeout: float = 10.0) -> Any:
        response = await asyncio.wait_for(self.call.read(), timeout)
        assert response is not grpc.aio.EOF, "stream ended"
        return response

    async def close(self) -> None:
        self.call.cancel()
        await self.channel.close()


def resource_names(response: Any) -> list[str]:
    if isinstance(response, discovery_pb2.DeltaDiscoveryResponse):
        return [r.name for r in response.resources]
    return [cluster_pb2.Cluster.FromString(a.value).name for a in response.resources]


# --- fixtures -----------------------------------------------------------------------------------------------


@dataclass
class Harness:
    ads: FakeAds
    proxy: XdsProxy
    socket: Path
    tables: list[nds_pb2.NameTable]
    bundles: list[list[str]]
    workdir: Path
    clients: list[AdsClient] = field(default_factory=list)

    def client(self, delta: bool) -> AdsClient:
        c = AdsClient(self.socket, delta)
        self.clients.append(c)
        return c


PCDS_ROOTS = ["-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"]


def _proxy_config_message() -> pb_message.Message:
    """An istio.mesh.v1alpha1.ProxyConfig with caCertificatesPem, via the project's own proto module."""
    from istio_agent.protos import proxyconfig_pb2

    return proxyconfig_pb2.ProxyConfig(ca_certificates_pem=PCDS_ROOTS)


@contextlib.asynccontextmanager
async def harness(tmp_path: Path, **options: Any) -> AsyncIterator[Harness]:
    resources: dict[str, list[tuple[str, pb_message.Message]]] = {
        typeurls.CLUSTER: clusters(3),
        typeurls.LISTENER: [],
        typeurls.NAME_TABLE: [("", name_table())],
        typeurls.PROXY_CONFIG: [("", _proxy_config_message())],
    }
    ads = FakeAds(resources)
    port = await ads.start()
    token = tmp_path / "var/run/secrets/tokens/istio-token"
    token.parent.mkdir(parents=True)
    token.write_text("the-token\n")
    tables: list[nds_pb2.NameTable] = []
    bundles: list[list[str]] = []
    settings = UpstreamSettings(
        f"127.0.0.1:{port}", workdir=tmp_path, insecure=True, cluster_id="cluster-7",
        headers=(("x-tenant", "blue"),), dial_timeout=options.pop("dial_timeout", 5.0),
    )
    hooks = XdsProxyHooks(
        on_name_table=options.pop("on_name_table", tables.append),
        on_trust_bundle=options.pop("on_trust_bundle", bundles.append),
        node_hook=options.pop("node_hook", None),
        on_event=options.pop("on_event", None),
    )
    proxy_options = XdsProxyOptions(
        socket_path=tmp_path / "etc/istio/proxy/XDS",
        upstream=settings,
        dns_enabled=options.pop("dns_enabled", True),
        pcds_enabled=options.pop("pcds_enabled", False),
        **options,
    )
    proxy = XdsProxy(proxy_options, hooks)
    await proxy.start()
    h = Harness(ads, proxy, proxy_options.socket_path, tables, bundles, tmp_path)
    try:
        yield h
    finally:
        for c in h.clients:
            await c.close()
        await proxy.stop()
        await ads.stop()
    assert not proxy_options.socket_path.exists()


NODE = "sidecar~10.0.0.1~echo-1.default~default.svc.cluster.local"


# --- tests ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("delta", [SOTW, DELTA], ids=["sotw", "delta"])
async def test_resources_flow_and_nds_is_consumed(tmp_path: Path, delta: bool) -> None:
    async with harness(tmp_path) as h:
        client = h.client(delta)
        await client.subscribe(typeurls.CLUSTER, NODE)
        cds = await client.read()
        assert cds.type_url == typeurls.CLUSTER
        assert len(resource_names(cds)) == 3
        await client.ack(cds)
        await client.subscribe(typeurls.LISTENER)
        lds = await client.read()
        assert lds.type_url == typeurls.LISTENER
        # After Envoy's first LDS request the agent subscribes to NDS itself, consumes it and ACKs.
        await eventually(lambda: h.tables, what="the name table callback")
        assert h.tables[0] == name_table()
        nds = h.ads.requests_of(typeurls.NAME_TABLE, delta)
        await eventually(lambda: len(h.ads.requests_of(typeurls.NAME_TABLE, delta)) >= 2, what="NDS ACK")
        nds = h.ads.requests_of(typeurls.NAME_TABLE, delta)
        assert nds[0].response_nonce == "" and nds[1].response_nonce.startswith("nonce-")
        assert not nds[1].HasField("error_detail")
        # The client saw only Envoy types; a later push still reaches it and NDS never does.
        h.ads.push(typeurls.CLUSTER, clusters(2, prefix="pushed"))
        pushed = await client.read()
        assert pushed.type_url == typeurls.CLUSTER and "pushed-0" in resource_names(pushed)[0]
        # The first upstream request carried the client's node unchanged; metadata arrived upstream.
        first = h.ads.requests[0][1]
        assert first.node.id == NODE
        md = h.ads.metadata[0]
        assert md["clusterid"] == "cluster-7"
        assert md["authorization"] == "Bearer the-token"
        assert md["x-tenant"] == "blue"
        assert h.proxy.stats.consumed == 1 and h.proxy.stats.dropped == 0


async def test_nds_not_subscribed_when_dns_is_off(tmp_path: Path) -> None:
    async with harness(tmp_path, dns_enabled=False) as h:
        client = h.client(SOTW)
        await client.subscribe(typeurls.LISTENER, NODE)
        await client.read()
        # A client asking for NDS itself gets nothing: the type is not for Envoy.
        await client.subscribe(typeurls.NAME_TABLE)
        await eventually(lambda: h.proxy.stats.dropped == 1, what="the NDS response to be dropped")
        assert len(h.ads.requests_of(typeurls.NAME_TABLE)) == 1  # only the client's, no agent subscription
        assert h.tables == []


@pytest.mark.parametrize("delta", [SOTW, DELTA], ids=["sotw", "delta"])
async def test_pcds_trust_bundle_and_nack(tmp_path: Path, delta: bool) -> None:
    calls: list[list[str]] = []

    def reject(bundle: list[str]) -> None:
        calls.append(bundle)
        raise ValueError("bad trust bundle")

    async with harness(tmp_path, pcds_enabled=True, on_trust_bundle=reject) as h:
        client = h.client(delta)
        await client.subscribe(typeurls.LISTENER, NODE)
        await client.read()
        await eventually(lambda: calls, what="the trust bundle callback")
        assert calls[0] == PCDS_ROOTS
        await eventually(lambda: len(h.ads.requests_of(typeurls.PROXY_CONFIG, delta)) >= 2, what="PCDS NACK")
        nack = h.ads.requests_of(typeurls.PROXY_CONFIG, delta)[1]
        assert (nack.error_detail.code, nack.error_detail.message) == (13, "bad trust bundle")


@pytest.mark.parametrize("delta", [SOTW, DELTA], ids=["sotw", "delta"])
async def test_health_withheld_until_lds_and_resent_on_reconnect(tmp_path: Path, delta: bool) -> None:
    async with harness(tmp_path, dns_enabled=False) as h:
        h.proxy.set_health(False, "readiness probe failed")
        client = h.client(delta)
        await client.subscribe(typeurls.CLUSTER, NODE)
        await client.read()
        await eventually(lambda: h.proxy.stats.requests == 1, what="the CDS request")
        assert h.ads.requests_of(typeurls.HEALTH_INFO) == []
        await client.subscribe(typeurls.LISTENER)
        await client.read()
        reports = await eventually(lambda: h.ads.requests_of(typeurls.HEALTH_INFO), what="a health report")
        assert (reports[0].error_detail.code, reports[0].error_detail.message) == (13, "readiness probe failed")
        h.proxy.set_health(True)
        await eventually(lambda: len(h.ads.requests_of(typeurls.HEALTH_INFO)) == 2, what="the healthy report")
        assert not h.ads.requests_of(typeurls.HEALTH_INFO)[1].HasField("error_detail")
        # A new stream gets the latest report again, after its LDS request.
        await client.close()
        again = h.client(delta)
        await again.subscribe(typeurls.LISTENER, NODE)
        await again.read()
        await eventually(lambda: len(h.ads.requests_of(typeurls.HEALTH_INFO)) == 3, what="the re-sent report")


@pytest.mark.parametrize("delta", [SOTW, DELTA], ids=["sotw", "delta"])
async def test_upstream_failure_ends_stream_and_reconnect_works(tmp_path: Path, delta: bool) -> None:
    async with harness(tmp_path, dial_timeout=1.0) as h:
        client = h.client(delta)
        await client.subscribe(typeurls.CLUSTER, NODE)
        await client.read()
        port = h.ads.port
        await h.ads.stop()
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await asyncio.wait_for(client.call.read(), 10)
        assert failure.value.code() == grpc.StatusCode.UNAVAILABLE  # istiod's own status, passed down
        # While istiod is down a new stream fails after the dial timeout with UNAVAILABLE.
        down = h.client(delta)
        await down.subscribe(typeurls.CLUSTER, NODE)
        with pytest.raises(grpc.aio.AioRpcError) as unavailable:
            await asyncio.wait_for(down.call.read(), 10)
        assert unavailable.value.code() == grpc.StatusCode.UNAVAILABLE
        assert h.proxy.stats.upstream_failures >= 2
        # istiod comes back on the same port: a reconnecting client is served by a fresh upstream stream.
        await h.ads.start(port)
        again = h.client(delta)
        await again.subscribe(typeurls.CLUSTER, NODE)
        response = await again.read()
        assert len(resource_names(response)) == 3


async def test_large_push_passes_through(tmp_path: Path) -> None:
    async with harness(tmp_path, dns_enabled=False) as h:
        h.ads.resources[typeurls.CLUSTER] = clusters(5000)
        client = h.client(SOTW)
        await client.subscribe(typeurls.CLUSTER, NODE)
        response = await client.read(timeout=30)
        assert len(response.resources) == 5000


def _held_by_proxy_frames(proxy: XdsProxy, min_size: int) -> list[str]:
    """Locals of the proxy's own suspended coroutines (its stream tasks) that hold a message of `min_size`
    bytes or more, or an action carrying one: what the proxy keeps while it waits for the next message."""
    held = []
    for task in list(proxy._pending):  # white box: the tasks awaiting gRPC reads and writes
        coro: Any = task.get_coro()
        while coro is not None and getattr(coro, "cr_frame", None) is not None:
            frame = coro.cr_frame
            if frame.f_code.co_filename.endswith("xds/proxy.py"):
                for name, value in frame.f_locals.items():
                    payload = getattr(value, "data", getattr(value, "value", value))
                    if isinstance(payload, bytes) and len(payload) >= min_size:
                        held.append(f"{frame.f_code.co_name}: {name} ({len(payload)} bytes)")
            coro = coro.cr_await
    return held


@pytest.mark.parametrize("delta", [SOTW, DELTA], ids=["sotw", "delta"])
async def test_handled_push_is_not_kept(tmp_path: Path, delta: bool) -> None:
    """Once a push is forwarded, or a NameTable consumed, the proxy keeps nothing of it while Envoy's stream
    stays open and the next push is awaited."""
    async with harness(tmp_path) as h:
        client = h.client(delta)
        await client.subscribe(typeurls.CLUSTER, NODE)
        await client.ack(await client.read())
        await client.subscribe(typeurls.LISTENER)
        await client.ack(await client.read())
        await eventually(lambda: h.tables, what="the name table callback")
        h.ads.push(typeurls.CLUSTER, clusters(5000))
        response = await client.read(timeout=30)
        assert len(resource_names(response)) == 5000
        await eventually(lambda: h.proxy.stats.responses == 3, what="the push forwarded")
        await asyncio.sleep(0.1)  # the proxy is back in its next read from istiod
        assert _held_by_proxy_frames(h.proxy, 100_000) == []
        big = nds_pb2.NameTable()
        for i in range(5000):
            big.table[f"svc-{i}.default.svc.cluster.local"].ips.append(f"10.96.{i // 256}.{i % 256}")
        h.ads.push(typeurls.NAME_TABLE, [("", big)])
        await eventually(lambda: len(h.tables) == 2, what="the big name table consumed")
        await asyncio.sleep(0.1)
        assert len(h.tables[1].table) == 5000
        assert _held_by_proxy_frames(h.proxy, 100_000) == []


async def test_slow_envoy_holds_back_upstream(tmp_path: Path) -> None:
    """Backpressure: with a client that does not read, the proxy stops reading istiod (bounded memory)."""
    pushes = 40
    async with harness(tmp_path, dns_enabled=False) as h:
        big = clusters(5000)
        client = h.client(SOTW)
        await client.subscribe(typeurls.CLUSTER, NODE)
        await client.read()
        for _ in range(pushes):
            h.ads.push(typeurls.CLUSTER, big)
        await eventually(lambda: h.proxy.stats.received >= 2, what="the proxy to start relaying")
        # ~35 MB is pending; the proxy holds one response and gRPC's windows a few more, never all of them.
        with pytest.raises(AssertionError, match="timed out"):
            await eventually(lambda: h.proxy.stats.received > pushes, timeout=1.0, what="read-ahead")
        assert h.ads.streams[0].queue.qsize() > 0  # istiod is held back by flow control
        for _ in range(pushes):
            assert len((await client.read()).resources) == 5000
        assert h.proxy.stats.received == pushes + 1


async def test_new_stream_replaces_previous(tmp_path: Path) -> None:
    async with harness(tmp_path, dns_enabled=False) as h:
        first = h.client(SOTW)
        await first.subscribe(typeurls.CLUSTER, NODE)
        await first.read()
        second = h.client(SOTW)
        await second.subscribe(typeurls.CLUSTER, NODE)
        await second.read()
        assert await asyncio.wait_for(first.call.read(), 10) is grpc.aio.EOF
        assert h.proxy.connected


async def test_node_hook_applies_to_first_request(tmp_path: Path) -> None:
    def hook(node: Any) -> None:
        node.metadata.update({"ISTIO_VERSION": "hooked"})

    async with harness(tmp_path, dns_enabled=False, node_hook=hook) as h:
        client = h.client(DELTA)
        await client.subscribe(typeurls.CLUSTER, NODE)
        await client.read()
        first = h.ads.requests[0][1]
        assert first.node.id == NODE and first.node.metadata["ISTIO_VERSION"] == "hooked"


async def test_stale_socket_is_replaced(tmp_path: Path) -> None:
    socket = tmp_path / "etc/istio/proxy/XDS"
    socket.parent.mkdir(parents=True)
    socket.write_text("stale")
    async with harness(tmp_path, dns_enabled=False) as h:
        client = h.client(SOTW)
        await client.subscribe(typeurls.CLUSTER, NODE)
        assert (await client.read()).type_url == typeurls.CLUSTER


def _resource_names_request(size: int, delta: bool) -> Any:
    """A well-formed request of about `size` bytes (a node and many resource names)."""
    names = [f"outbound|80||svc-{i:07d}.default.svc.cluster.local" for i in range(size // 52)]
    if delta:
        request: Any = discovery_pb2.DeltaDiscoveryRequest(type_url=typeurls.CLUSTER, resource_names_subscribe=names)
    else:
        request = discovery_pb2.DiscoveryRequest(type_url=typeurls.CLUSTER, resource_names=names)
    request.node.id = NODE
    return request


@pytest.mark.parametrize("delta", [SOTW, DELTA], ids=["sotw", "delta"])
async def test_oversized_and_garbage_streams_neither_replace_envoy_nor_reach_istiod(tmp_path: Path,
                                                                                   delta: bool) -> None:
    async with harness(tmp_path, dns_enabled=False) as h:
        envoy = h.client(delta)
        await envoy.subscribe(typeurls.CLUSTER, NODE)
        await envoy.read()
        upstream_streams = len(h.ads.metadata)
        # Over upstream's 4 MiB: refused by its length prefix, before anything reads it.
        oversized = h.client(delta)
        await oversized.call.write(_resource_names_request(5 * 1024 * 1024, delta))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await asyncio.wait_for(oversized.call.read(), 10)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Not a (Delta)DiscoveryRequest at all.
        channel = grpc.aio.insecure_channel(f"unix:{h.socket}")
        try:
            garbage: Any = channel.stream_stream(routing.DELTA_METHOD if delta else routing.SOTW_METHOD)()
            await garbage.write(b"\xff\xff\xff\xff not protobuf")
            with pytest.raises(grpc.aio.AioRpcError) as rejected:
                await asyncio.wait_for(garbage.read(), 10)
            assert rejected.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        finally:
            await channel.close()
        await eventually(lambda: h.proxy.stats.streams == 3, what="both streams to have been served")
        # Envoy's stream is still the one proxied: a push reaches it, and istiod never saw the other two.
        h.ads.push(typeurls.CLUSTER, clusters(2, prefix="after"))
        pushed = await envoy.read()
        assert "after-0" in resource_names(pushed)[0]
        assert len(h.ads.metadata) == upstream_streams
        await eventually(lambda: h.proxy.pending_io == 2, what="only Envoy's stream to be reading")


async def test_large_request_under_the_limit_is_relayed(tmp_path: Path) -> None:
    async with harness(tmp_path, dns_enabled=False) as h:
        client = h.client(SOTW)
        request = _resource_names_request(3 * 1024 * 1024, delta=False)
        await client.call.write(request)
        await client.read()
        await eventually(lambda: h.ads.requests, what="the request upstream")
        assert list(h.ads.requests[0][1].resource_names) == list(request.resource_names)


async def test_ended_streams_leave_no_read_or_write_behind(tmp_path: Path) -> None:
    """Streams replaced, cut by the client, or ended by istiod: each one's tasks end on their own."""
    async with harness(tmp_path, dns_enabled=False) as h:
        for _ in range(3):  # each replaces the previous
            client = h.client(DELTA)
            await client.subscribe(typeurls.CLUSTER, NODE)
            await client.read()
        await h.clients[-1].close()  # the client goes away mid-stream
        await eventually(lambda: not h.proxy.connected, what="the last stream to end")
        again = h.client(SOTW)
        await again.subscribe(typeurls.CLUSTER, NODE)
        await again.read()
        await h.ads.stop()  # istiod goes away
        with pytest.raises(grpc.aio.AioRpcError):
            await asyncio.wait_for(again.call.read(), 10)
        await eventually(lambda: h.proxy.pending_io == 0, what="every stream task to end")
