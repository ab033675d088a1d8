"""istiod-local's ADS server on a real socket, driven by a grpc.aio ADS client (SotW and Delta).

The stream is ordered and the server answers requests in order, so "no
response to this ACK" is shown by sending another request afterwards and
seeing its answer arrive first.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import struct_pb2
from google.rpc import status_pb2

from istio_agent.protos import nds_pb2, typeurls
from istiod_local.controlplane.xds.ads import AdsServer
from istiod_local.controlplane.xds.registry import parse_registry

REGISTRY = """
services:
- name: echo
  selector: {app: echo}
  ports: [{name: http, port: 80, targetPort: 8080}]
  clusterIP: 10.96.0.20
- name: db
  selector: {app: db}
  ports: [{name: tcp, port: 5432}]
  clusterIP: 10.96.0.30
workloads:
- {name: echo-1, serviceAccount: echo, labels: {app: echo}, ip: 10.244.0.5}
- {name: db-1, serviceAccount: db, labels: {app: db}}
"""
ECHO_CLUSTER = "outbound|80||echo.default.svc.cluster.local"
DB_CLUSTER = "outbound|5432||db.default.svc.cluster.local"


def node(pod: str = "client-1", ip: str = "10.244.0.9", namespace: str = "default", **meta: Any) -> base_pb2.Node:
    metadata = struct_pb2.Struct()
    metadata.update({"NAMESPACE": namespace, **meta})
    return base_pb2.Node(id=f"sidecar~{ip}~{pod}.{namespace}~{namespace}.svc.cluster.local", metadata=metadata)


class Stream:
    """One ADS stream: send requests, await responses."""

    def __init__(self, call: Any) -> None:
        self.call = call

    async def send(self, request: Any) -> None:
        await self.call.write(request)

    async def recv(self) -> Any:
        return await asyncio.wait_for(self.call.read(), 10)


@pytest.fixture
async def served() -> AsyncIterator[tuple[AdsServer, ads_pb2_grpc.AggregatedDiscoveryServiceStub]]:
    ads = AdsServer(parse_registry(REGISTRY))
    server = grpc.aio.server()
    ads.register(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield ads, ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
    await channel.close()
    await server.stop(None)


def _names(response: discovery_pb2.DiscoveryResponse, message: Any) -> set[str]:
    out = set()
    for resource in response.resources:
        item = message()
        resource.Unpack(item)
        out.add(getattr(item, "name", "") or getattr(item, "cluster_name", ""))
    return out


def _ack(response: discovery_pb2.DiscoveryResponse, names: list[str] | None = None) -> discovery_pb2.DiscoveryRequest:
    return discovery_pb2.DiscoveryRequest(type_url=response.type_url, version_info=response.version_info,
                                          response_nonce=response.nonce, resource_names=names or [])


async def test_sotw_wildcard_clusters_ack_and_named_endpoints(served: Any) -> None:
    _ads, stub = served
    stream = Stream(stub.StreamAggregatedResources())
    await stream.send(discovery_pb2.DiscoveryRequest(node=node(), type_url=typeurls.CLUSTER))
    cds = await stream.recv()
    assert cds.type_url == typeurls.CLUSTER and cds.nonce and cds.version_info
    assert {ECHO_CLUSTER, DB_CLUSTER, "PassthroughCluster", "BlackHoleCluster"} <= _names(cds, cluster_pb2.Cluster)

    await stream.send(_ack(cds))  # an ACK: no answer
    await stream.send(discovery_pb2.DiscoveryRequest(type_url=typeurls.ENDPOINT, resource_names=[ECHO_CLUSTER]))
    eds = await stream.recv()
    assert eds.type_url == typeurls.ENDPOINT
    assert _names(eds, endpoint_pb2.ClusterLoadAssignment) == {ECHO_CLUSTER}
    cla = endpoint_pb2.ClusterLoadAssignment()
    eds.resources[0].Unpack(cla)
    endpoint = cla.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    assert (endpoint.address, endpoint.port_value) == ("10.244.0.5", 8080)

    # Changing the subscription on an ACK is answered with the new set.
    await stream.send(_ack(eds, [ECHO_CLUSTER, DB_CLUSTER]))
    eds2 = await stream.recv()
    assert _names(eds2, endpoint_pb2.ClusterLoadAssignment) == {ECHO_CLUSTER, DB_CLUSTER}
    await stream.call.done_writing()


async def test_sotw_nack_is_logged_and_not_answered(served: Any, caplog: pytest.LogCaptureFixture) -> None:
    ads, stub = served
    stream = Stream(stub.StreamAggregatedResources())
    await stream.send(discovery_pb2.DiscoveryRequest(node=node(), type_url=typeurls.LISTENER))
    lds = await stream.recv()
    nack = _ack(lds)
    nack.error_detail.CopyFrom(status_pb2.Status(code=13, message="listener 'x' rejected: bad config"))
    await stream.send(nack)
    health = discovery_pb2.DiscoveryRequest(type_url=typeurls.HEALTH_INFO)
    health.error_detail.CopyFrom(status_pb2.Status(code=13, message="unhealthy"))
    await stream.send(health)  # health reports are never answered
    await stream.send(discovery_pb2.DiscoveryRequest(type_url=typeurls.NAME_TABLE))
    nds = await stream.recv()
    assert nds.type_url == typeurls.NAME_TABLE
    table = nds_pb2.NameTable()
    nds.resources[0].Unpack(table)
    assert list(table.table["echo.default.svc.cluster.local"].ips) == ["10.96.0.20"]
    assert "bad config" in caplog.text
    (status,) = ads.connections()
    assert status["watches"][typeurls.LISTENER]["nacked"] == "listener 'x' rejected: bad config"
    await stream.call.done_writing()


async def test_sotw_push_on_registry_change_and_stale_nonce_ignored(served: Any) -> None:
    ads, stub = served
    stream = Stream(stub.StreamAggregatedResources())
    await stream.send(discovery_pb2.DiscoveryRequest(node=node(), type_url=typeurls.CLUSTER))
    cds = await stream.recv()
    await stream.send(_ack(cds))
    await stream.send(discovery_pb2.DiscoveryRequest(type_url=typeurls.ENDPOINT, resource_names=[ECHO_CLUSTER]))
    eds = await stream.recv()
    await stream.send(_ack(eds, [ECHO_CLUSTER]))

    ads.update_registry(parse_registry(REGISTRY.replace("name: db\n", "name: pg\n")))
    pushed = await stream.recv()
    assert pushed.type_url == typeurls.CLUSTER and pushed.nonce != cds.nonce
    names = _names(pushed, cluster_pb2.Cluster)
    assert "outbound|5432||pg.default.svc.cluster.local" in names and DB_CLUSTER not in names
    # The cluster set changed, so endpoints are re-sent too (Envoy re-warms replaced clusters).
    assert (await stream.recv()).type_url == typeurls.ENDPOINT

    # A request still carrying the old nonce is stale: ignored even though it names new resources.
    await stream.send(_ack(cds, ["bogus"]))
    await stream.send(discovery_pb2.DiscoveryRequest(type_url=typeurls.ROUTE, resource_names=["80"]))
    rds = await stream.recv()
    assert rds.type_url == typeurls.ROUTE
    await stream.call.done_writing()


async def test_sotw_learns_pod_ip_from_node_and_pushes_endpoints(served: Any) -> None:
    _ads, stub = served
    watcher = Stream(stub.StreamAggregatedResources())
    await watcher.send(discovery_pb2.DiscoveryRequest(node=node(), type_url=typeurls.ENDPOINT,
                                                      resource_names=[DB_CLUSTER]))
    eds = await watcher.recv()
    cla = endpoint_pb2.ClusterLoadAssignment()
    eds.resources[0].Unpack(cla)
    assert not cla.endpoints  # db-1 has no address yet: an empty assignment, not silence
    await watcher.send(_ack(eds, [DB_CLUSTER]))

    pod = Stream(stub.StreamAggregatedResources())
    await pod.send(discovery_pb2.DiscoveryRequest(node=node("db-1", "10.244.0.7", SERVICE_ACCOUNT="db"),
                                                  type_url=typeurls.LISTENER))
    await pod.recv()
    pushed = await watcher.recv()
    pushed.resources[0].Unpack(cla)
    addr = cla.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    assert addr.address == "10.244.0.7" and addr.port_value == 5432

    await pod.call.done_writing()
    gone = await watcher.recv()  # the pod went away: its endpoint too
    gone.resources[0].Unpack(cla)
    assert not cla.endpoints
    await watcher.call.done_writing()


async def test_bad_node_id_is_refused(served: Any) -> None:
    _, stub = served
    call = stub.StreamAggregatedResources()
    await call.write(discovery_pb2.DiscoveryRequest(node=base_pb2.Node(id="not-a-node"), type_url=typeurls.CLUSTER))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not-a-node" in (info.value.details() or "")


def _delta_names(response: discovery_pb2.DeltaDiscoveryResponse) -> set[str]:
    return {r.name for r in response.resources}


async def test_delta_wildcard_push_removal_and_subscriptions(served: Any) -> None:
    ads, stub = served
    stream = Stream(stub.DeltaAggregatedResources())
    await stream.send(discovery_pb2.DeltaDiscoveryRequest(node=node(), type_url=typeurls.CLUSTER))
    cds = await stream.recv()
    assert {ECHO_CLUSTER, DB_CLUSTER} <= _delta_names(cds)
    assert all(r.version for r in cds.resources)
    await stream.send(discovery_pb2.DeltaDiscoveryRequest(type_url=typeurls.CLUSTER, response_nonce=cds.nonce))

    await stream.send(discovery_pb2.DeltaDiscoveryRequest(type_url=typeurls.ENDPOINT,
                                                          resource_names_subscribe=[ECHO_CLUSTER, "missing"]))
    eds = await stream.recv()
    assert _delta_names(eds) == {ECHO_CLUSTER}
    assert list(eds.removed_resources) == ["missing"]
    await stream.send(discovery_pb2.DeltaDiscoveryRequest(type_url=typeurls.ENDPOINT, response_nonce=eds.nonce))

    ads.update_registry(parse_registry(REGISTRY.replace("name: db\n", "name: pg\n")))
    pushed = await stream.recv()
    assert pushed.type_url == typeurls.CLUSTER
    assert _delta_names(pushed) == {"outbound|5432||pg.default.svc.cluster.local"}  # only what changed
    assert list(pushed.removed_resources) == [DB_CLUSTER]

    # Unsubscribing is silent; a NACK is recorded.
    await stream.send(discovery_pb2.DeltaDiscoveryRequest(type_url=typeurls.ENDPOINT,
                                                          resource_names_unsubscribe=[ECHO_CLUSTER]))
    nack = discovery_pb2.DeltaDiscoveryRequest(type_url=typeurls.CLUSTER, response_nonce=pushed.nonce)
    nack.error_detail.CopyFrom(status_pb2.Status(code=3, message="cluster rejected"))
    await stream.send(nack)
    await stream.send(discovery_pb2.DeltaDiscoveryRequest(type_url=typeurls.NAME_TABLE))
    nds = await stream.recv()
    assert nds.type_url == typeurls.NAME_TABLE and [r.name for r in nds.resources] == [""]
    (status,) = ads.connections()
    assert status["delta"] and status["watches"][typeurls.CLUSTER]["nacked"] == "cluster rejected"
    await stream.call.done_writing()


async def test_delta_reconnect_with_initial_versions_sends_only_changes(served: Any) -> None:
    ads, stub = served
    first = Stream(stub.DeltaAggregatedResources())
    await first.send(discovery_pb2.DeltaDiscoveryRequest(node=node(), type_url=typeurls.CLUSTER))
    cds = await first.recv()
    versions = {r.name: r.version for r in cds.resources}
    await first.call.done_writing()

    ads.update_registry(parse_registry(REGISTRY.replace("port: 5432", "port: 5433")))
    second = Stream(stub.DeltaAggregatedResources())
    await second.send(discovery_pb2.DeltaDiscoveryRequest(node=node(), type_url=typeurls.CLUSTER,
                                                          initial_resource_versions=versions))
    resumed = await second.recv()
    assert _delta_names(resumed) == {"outbound|5433||db.default.svc.cluster.local"}
    assert list(resumed.removed_resources) == [DB_CLUSTER]
    await second.call.done_writing()
