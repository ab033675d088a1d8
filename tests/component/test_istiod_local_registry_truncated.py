"""The registry file truncated to zero bytes while the real istiod-local serves (what `>` or an editor leaves).

The empty file is refused like any invalid one: the log says so, and names and
endpoints keep the previous services until a valid file comes back.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import struct_pb2
from launchers import IstiodLocal, RegistryFile, echo_registry
from support import eventually

from istio_agent.protos import nds_pb2, typeurls

ECHO_HOST = "echo.default.svc.cluster.local"
ECHO_CLUSTER = f"outbound|80||{ECHO_HOST}"


def client_node() -> base_pb2.Node:
    metadata = struct_pb2.Struct()
    metadata.update({"NAMESPACE": "default", "DNS_CAPTURE": "true", "DNS_AUTO_ALLOCATE": "true"})
    return base_pb2.Node(id="sidecar~10.244.0.9~client-1.default~default.svc.cluster.local", metadata=metadata)


async def names_and_endpoints(address: str) -> tuple[set[str], list[str]]:
    """One fresh ADS stream: the NameTable's hosts and the echo cluster's endpoint addresses."""
    async with grpc.aio.insecure_channel(address) as channel:
        call: Any = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).StreamAggregatedResources()
        await call.write(discovery_pb2.DiscoveryRequest(node=client_node(), type_url=typeurls.NAME_TABLE))
        nds = await asyncio.wait_for(call.read(), 10)
        table = nds_pb2.NameTable()
        nds.resources[0].Unpack(table)
        await call.write(discovery_pb2.DiscoveryRequest(type_url=typeurls.ENDPOINT, resource_names=[ECHO_CLUSTER]))
        eds = await asyncio.wait_for(call.read(), 10)
        endpoints = []
        for resource in eds.resources:
            assignment = endpoint_pb2.ClusterLoadAssignment()
            resource.Unpack(assignment)
            endpoints += [lb.endpoint.address.socket_address.address
                          for group in assignment.endpoints for lb in group.lb_endpoints]
        await call.done_writing()
        return set(table.table), endpoints


async def test_a_truncated_registry_is_refused_and_the_previous_services_stay(
        istiod: IstiodLocal, registry: RegistryFile) -> None:
    before = await names_and_endpoints(istiod.plaintext)
    assert ECHO_HOST in before[0] and before[1] == ["127.0.0.1"], before

    registry.path.write_bytes(b"")  # truncated in place, as `> mesh.yaml` leaves it
    await eventually(lambda: "the registry is empty" in istiod.log_text(), "istiod-local to refuse the empty registry",
                     on_timeout=istiod.log_text)
    assert "previous configuration stays in service" in istiod.log_text()
    assert await names_and_endpoints(istiod.plaintext) == before

    registry.write(echo_registry(workload_ip="127.0.0.2"))  # a valid file comes back and is served

    async def moved() -> bool:
        return (await names_and_endpoints(istiod.plaintext))[1] == ["127.0.0.2"]

    await eventually(moved, "the restored registry to be served", interval=0.1)
