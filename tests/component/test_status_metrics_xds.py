"""The XDS proxy's event hook feeding the agent's metrics, with a real gRPC ADS server and client.

Reuses the XDS proxy tests' harness (a real grpc.aio ADS server in front, a real ADS client on
the proxy's socket); the client NACKs like Envoy does, the agent rejects a name table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from envoy.service.discovery.v3 import discovery_pb2
from google.rpc import status_pb2
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from support import eventually
from test_xds_proxy_ads import DELTA, NODE, SOTW, harness

from istio_agent.metrics import CollectorRegistry, generate_openmetrics
from istio_agent.protos import nds_pb2, typeurls
from istio_agent.status.agent_metrics import AgentMetrics
from istio_agent.xds.core import routing


def values(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every series under the name a scraper stores (the OpenMetrics parser keeps upstream's sums' names)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(generate_openmetrics(registry).decode()) for s in f.samples}


def terminations(registry: CollectorRegistry) -> dict[str, float]:
    got = values(registry)
    return {f"{side}:{kind}": got[(f"istio_agent_{side}_connection_terminations", (("type", kind),))]
            for side in ("istiod", "envoy") for kind in ("cancelled", "error")}


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
        assert got[("istio_agent_xds_proxy_requests", ())] == 3
        assert got[("istio_agent_xds_proxy_responses", ())] == 2
        # The largest request read from the client: the first, which names the node.
        assert got[("istio_agent_pilot_xds_recv_max", ())] == h.proxy.stats.max_request > 0
        await client.close()
        h.clients.clear()
        await eventually(lambda: values(registry)[("istio_agent_xds_proxy_connections", (("mode", mode),))] == 0,
                         what="the stream to end")
        # Envoy went away: its side ended cleanly, and the proxy cancelled istiod's.
        assert terminations(registry) == {"istiod:cancelled": 1, "istiod:error": 0, "envoy:cancelled": 1,
                                          "envoy:error": 0}


@pytest.mark.parametrize("delta", [SOTW, DELTA], ids=["sotw", "delta"])
async def test_connection_failures_and_terminations_as_upstream_counts_them(tmp_path: Path, delta: bool) -> None:
    registry = CollectorRegistry()
    metrics = AgentMetrics(registry, process_metrics=False)
    async with harness(tmp_path, on_event=metrics.xds_event, dial_timeout=1.0) as h:
        client = h.client(delta)
        await client.subscribe(typeurls.CLUSTER, NODE)
        await client.read()
        port = h.ads.port
        await h.ads.stop()  # istiod goes away: its end is the stream's, and Envoy's side is cancelled by the proxy
        await eventually(lambda: terminations(registry)["envoy:cancelled"] == 1, what="the stream to end")
        ended = terminations(registry)
        assert ended["istiod:cancelled"] + ended["istiod:error"] == 1 and ended["envoy:error"] == 0, ended
        assert values(registry)[("istio_agent_istiod_connection_failures", ())] == 0
        # While istiod is down a new stream cannot dial: a connection failure, and no termination at all.
        down = h.client(delta)
        await down.subscribe(typeurls.CLUSTER, NODE)
        await eventually(lambda: values(registry)[("istio_agent_istiod_connection_failures", ())] == 1,
                         what="the failed dial")
        assert terminations(registry) == ended
        await h.ads.start(port)
        # A client sending garbage ends Envoy's side with an error before anything is dialled.
        channel = grpc.aio.insecure_channel(f"unix:{h.socket}")
        try:
            garbage: Any = channel.stream_stream(routing.DELTA_METHOD if delta else routing.SOTW_METHOD)()
            await garbage.write(b"\xff\xff\xff\xff not protobuf")
            await eventually(lambda: terminations(registry)["envoy:error"] == 1, what="the garbage stream to end")
        finally:
            await channel.close()
        assert {k: v for k, v in terminations(registry).items() if k.startswith("istiod")} == {
            k: v for k, v in ended.items() if k.startswith("istiod")}
