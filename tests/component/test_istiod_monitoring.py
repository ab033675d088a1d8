"""istiod-local's monitoring port (`serve --monitoring-addr`), a real process with a grpcio ADS client connected.

The client asks for clusters and listeners, ACKs the clusters and NACKs the
listeners; then the registry changes and the push arrives. `/metrics`,
`/debug/connections` and `/debug/syncz` must show each step with upstream's
names and shapes, and the view's collector must read the same numbers.
"""

from __future__ import annotations

import json
import queue
import re
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import struct_pb2
from google.rpc import status_pb2
from launchers import IstiodLocal, RegistryFile, echo_registry
from needs import need_file
from support import ISTIOD_LOCAL, poll

from istio_agent.protos import typeurls
from istiod_local.meshview.collector import Collector
from istiod_local.meshview.stats import prometheus_samples

MONITORING_LINE = re.compile(r"monitoring serving on (\S+)")
NODE_ID = "sidecar~127.0.0.9~client-1.default~default.svc.cluster.local"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[IstiodLocal, RegistryFile, str]]:
    need_file(ISTIOD_LOCAL)
    registry = RegistryFile(tmp_path / "mesh.yaml", echo_registry())
    istiod = IstiodLocal(tmp_path / "state", registry=registry, args=["--monitoring-addr", "127.0.0.1:0"])
    with istiod:
        address = poll(lambda: next((m.group(1) for m in map(MONITORING_LINE.search, istiod.lines) if m), None),
                       "the monitoring serving line", 20, istiod.log_text)
        yield istiod, registry, address


def get(address: str, path: str) -> Any:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as response:
        body = response.read().decode()
    return json.loads(body) if path.startswith("/debug/") else body


def metric(text: str, name: str, **labels: str) -> float | None:
    for sample, have, value in prometheus_samples(text, name):
        if sample == name and all(have.get(k) == v for k, v in labels.items()):
            return value
    return None


def request(type_url: str, nonce: str = "", error: str = "") -> discovery_pb2.DiscoveryRequest:
    metadata = struct_pb2.Struct()
    metadata.update({"NAMESPACE": "default", "ISTIO_VERSION": "1.28.0"})
    out = discovery_pb2.DiscoveryRequest(type_url=type_url, response_nonce=nonce)
    out.node.id = NODE_ID
    out.node.metadata.CopyFrom(metadata)
    if error:
        out.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
    return out


def test_metrics_connections_and_syncz_follow_a_stream(served: tuple[IstiodLocal, RegistryFile, str]) -> None:
    istiod, registry, address = served
    before = get(address, "/metrics")
    assert metric(before, "pilot_xds", version="1.28.0") is None
    assert get(address, "/debug/connections") == {"totalClients": 0}

    channel = grpc.insecure_channel(istiod.plaintext)
    stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
    requests: queue.Queue[discovery_pb2.DiscoveryRequest | None] = queue.Queue()

    def feed() -> Iterator[discovery_pb2.DiscoveryRequest]:
        while (item := requests.get()) is not None:
            yield item

    responses = stub.StreamAggregatedResources(feed())
    try:
        requests.put(request(typeurls.CLUSTER))
        cds = next(responses)
        requests.put(request(typeurls.LISTENER))
        lds = next(responses)
        requests.put(request(typeurls.CLUSTER, cds.nonce))  # ACK
        requests.put(request(typeurls.LISTENER, lds.nonce, "listener rejected for the test"))  # NACK

        def acked() -> Any:
            text = get(address, "/metrics")
            return text if metric(text, "pilot_total_xds_rejects", type="lds") == 1 else None

        text = poll(acked, "the NACK counted", 10, istiod.log_text)
        assert metric(text, "pilot_xds", version="1.28.0") == 1
        assert metric(text, "pilot_xds_pushes", type="cds") == 1
        assert metric(text, "pilot_xds_pushes", type="lds") == 1
        assert metric(text, "pilot_xds_lds_reject", node=NODE_ID) == 1
        assert metric(text, "pilot_xds_cds_reject", node=NODE_ID) is None
        assert metric(text, "istiod_local_last_push_timestamp_seconds") == 0  # answers so far, no push

        connections = get(address, "/debug/connections")
        assert connections["totalClients"] == 1
        client = connections["clients"][0]
        assert client["connectionId"].startswith(NODE_ID) and client["address"].startswith("127.0.0.1:")
        assert client["connectedAt"].endswith("Z")
        assert client["watches"] == {typeurls.CLUSTER: ["*"], typeurls.LISTENER: ["*"]}

        (status,) = get(address, "/debug/syncz")
        assert status["proxy"] == NODE_ID and status["proxy_type"] == "sidecar"
        assert status["istio_version"] == "1.28.0"
        assert status["cluster_sent"] == cds.nonce and status["cluster_acked"] == cds.nonce
        assert status["listener_sent"] == lds.nonce and "listener_acked" not in status
        assert status["resources"][typeurls.LISTENER]["lastError"] == "listener rejected for the test"
        assert get(address, "/debug/syncz?namespace=other") == []

        version = metric(text, "istiod_local_mesh_version")
        registry.write(echo_registry(extra_services="- {name: extra, namespace: default, selector: {app: x}, "
                                                    "ports: [{name: http, port: 81, protocol: HTTP}]}\n"))
        pushed = next(responses)
        assert pushed.type_url == typeurls.CLUSTER

        def pushed_seen() -> Any:
            text = get(address, "/metrics")
            return text if metric(text, "pilot_xds_pushes", type="cds") == 2 else None

        text = poll(pushed_seen, "the push counted", 10, istiod.log_text)
        assert (metric(text, "istiod_local_last_push_timestamp_seconds") or 0) > 0
        assert (metric(text, "istiod_local_mesh_version") or 0) > (version or 0)
        assert metric(text, "pilot_services") == 2

        # The view's collector reads the same endpoint.
        collector = Collector(address)
        try:
            _, sample = collector.sample([], 0.0)
        finally:
            collector.close()
        assert sample is not None and sample.reachable and sample.connected == 1
        assert sample.proxies == (client["connectionId"],)
        assert sample.pushes["cds"] == 2 and sample.rejects == {"lds": 1.0}
    finally:
        requests.put(None)
        responses.cancel()
        channel.close()
    poll(lambda: get(address, "/debug/connections") == {"totalClients": 0}, "the stream's end seen", 10)
    assert metric(get(address, "/metrics"), "pilot_xds", version="1.28.0") is None


def test_off_disables_and_a_taken_port_is_not_fatal(tmp_path: Path) -> None:
    need_file(ISTIOD_LOCAL)
    with IstiodLocal(tmp_path / "a", args=["--monitoring-addr", "off"]) as quiet:
        assert not any("monitoring serving" in line for line in quiet.lines)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        with IstiodLocal(tmp_path / "b", args=["--monitoring-addr", f"127.0.0.1:{port}"]) as second:
            line = poll(lambda: next((x for x in second.lines if "monitoring: cannot listen" in x), None),
                        "the refusal logged", 10, second.log_text)
            assert f"127.0.0.1:{port}" in line and second.running
    finally:
        taken.close()
