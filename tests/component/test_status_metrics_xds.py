"""The XDS proxy's event hook feeding the agent's metrics, with a real gRPC ADS server and client.

Reuses the XDS proxy tests' harness (a real grpc.aio ADS server in front, a real ADS client on
the proxy's socket); the client NACKs like Envoy does, the agent rejects a name table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from google.rpc import status_pb2
from prometheus_client.parser import text_string_to_metric_families
from support import eventually
from test_xds_proxy_ads import DELTA, NODE, SOTW, harness

from istio_agent.metrics import CollectorRegistry, generate_latest
from istio_agent.protos import nds_pb2, typeurls
from istio_agent.status.agent_metrics import AgentMetrics


def values(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples}


def nack(response: Any, delta: bool) -> Any:
    error = status_pb2.Status(code=3, message="cluster rejected")
    if delta:
        return discovery_pb2.DeltaDiscoveryRequest(type_url=response.type_url, response_nonce=response.nonce,
                                                   error_detail=error)
    return discovery_pb2.DiscoveryRequest(type_url=response.type_url, response_nonce=response.nonce,
                                          version_info="", error_detail=error)


def reject(_table: nds_pb2.NameTable) -> None:
    raise ValueError("unusable name table")


@pytest.mark.parametrize("delta", [SOTW, DELTA], ids=["sotw", "delta"])
async def test_streams_pushes_and_nacks_by_type(tmp_path: Path, delta: bool) -> None:
    registry = CollectorRegistry()
    metrics = AgentMetrics(registry, process_metrics=False)
    mode = "delta" if delta else "sotw"
    async with harness(tmp_path, on_event=metrics.xds_event, on_name_table=reject) as h:
        metrics.watch_xds(h.proxy)
        client = h.client(delta)
        await client.subscribe(typeurls.CLUSTER, NODE)
        cds = await client.read()
        await client.call.write(nack(cds, delta))
        await client.subscribe(typeurls.LISTENER)
        await client.read()
        await eventually(lambda: values(registry).get(
            ("istio_agent_xds_nacks_total", (("by", "agent"), ("type", "nds")))), what="the agent's NDS NACK")
        got = values(registry)
        assert got[("istio_agent_xds_nacks_total", (("by", "envoy"), ("type", "cds")))] == 1
        assert got[("istio_agent_xds_pushes_total", (("type", "cds"),))] == 1
        assert got[("istio_agent_xds_pushes_total", (("type", "lds"),))] == 1
        assert got[("istio_agent_xds_pushes_total", (("type", "nds"),))] == 1
        assert got[("istio_agent_xds_proxy_connections", (("mode", mode),))] == 1
        assert got[("istio_agent_xds_proxy_streams_total", (("mode", mode),))] == 1
        assert got[("istio_agent_xds_proxy_requests_total", ())] == 3
        assert got[("istio_agent_xds_proxy_responses_total", ())] == 2
        await client.close()
        h.clients.clear()
        await eventually(lambda: values(registry)[("istio_agent_xds_proxy_connections", (("mode", mode),))] == 0,
                         what="the stream to end")
