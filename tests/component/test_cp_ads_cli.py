"""`istiod-local serve --registry`: ADS on the CA's ports, token-checked on TLS, reloading the registry file."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import struct_pb2
from support import LineCollector, serving_addresses, stop_process

from istio_agent.controlplane.xds import typeurls

ROOT = Path(__file__).resolve().parents[2]
ISTIOD_LOCAL = str(ROOT / ".venv" / "bin" / "istiod-local")
REGISTRY = """\
services:
- name: echo
  selector: {app: echo}
  ports: [{name: http, port: 80, targetPort: 8080}]
workloads:
- {name: echo-1, serviceAccount: echo, labels: {app: echo}, ip: 10.244.0.5}
"""
NODE_META = {"NAMESPACE": "default", "SERVICE_ACCOUNT": "sleep"}


class Istiod:
    def __init__(self, state: Path, registry: Path) -> None:
        self.proc = subprocess.Popen(
            [ISTIOD_LOCAL, "serve", "--state-dir", str(state), "--grpc-addr", "127.0.0.1:0",
             "--secure-grpc-addr", "127.0.0.1:0", "--registry", str(registry)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.out = LineCollector(self.proc.stderr)
        self.plain, self.secure = serving_addresses(self.proc, self.out)

    def log(self) -> str:
        return self.out.text()

    def stop(self) -> None:
        stop_process(self.proc, grace=20)


@pytest.fixture
def istiod(tmp_path: Path) -> Iterator[tuple[Istiod, Path, Path]]:
    registry = tmp_path / "mesh.yaml"
    registry.write_text(REGISTRY)
    state = tmp_path / "state"
    served = Istiod(state, registry)
    yield served, state, registry
    served.stop()


def _node() -> base_pb2.Node:
    meta = struct_pb2.Struct()
    meta.update(NODE_META)
    return base_pb2.Node(id="sidecar~10.244.0.9~sleep-1.default~default.svc.cluster.local", metadata=meta)


def _clusters(response: discovery_pb2.DiscoveryResponse) -> set[str]:
    names = set()
    for resource in response.resources:
        cluster = cluster_pb2.Cluster()
        resource.Unpack(cluster)
        names.add(cluster.name)
    return names


async def _first_cds(channel: grpc.aio.Channel, metadata: Any = None) -> tuple[Any, discovery_pb2.DiscoveryResponse]:
    call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).StreamAggregatedResources(metadata=metadata)
    await call.write(discovery_pb2.DiscoveryRequest(node=_node(), type_url=typeurls.CLUSTER))
    return call, await asyncio.wait_for(call.read(), 15)


def _token(state: Path, account: str = "sleep") -> str:
    done = subprocess.run([ISTIOD_LOCAL, "token", "--state-dir", str(state), "--namespace", "default",
                           "--service-account", account], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _tls_channel(istiod: Istiod, state: Path) -> grpc.aio.Channel:
    creds = grpc.ssl_channel_credentials(root_certificates=(state / "root-cert.pem").read_bytes())
    return grpc.aio.secure_channel(istiod.secure, creds,
                                   options=[("grpc.ssl_target_name_override", "istiod.istio-system.svc")])


async def test_ads_on_both_ports_with_tokens_on_tls(istiod: tuple[Istiod, Path, Path]) -> None:
    served, state, _ = istiod
    async with grpc.aio.insecure_channel(served.plain) as channel:
        call, cds = await _first_cds(channel)
        assert "outbound|80||echo.default.svc.cluster.local" in _clusters(cds)
        call.cancel()

    async with _tls_channel(served, state) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _first_cds(channel)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _first_cds(channel, [("authorization", f"Bearer {_token(state, 'other')}")])
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "service account" in (info.value.details() or "")
        call, cds = await _first_cds(channel, [("authorization", f"Bearer {_token(state)}")])
        assert "outbound|80||echo.default.svc.cluster.local" in _clusters(cds)
        call.cancel()


async def test_registry_file_changes_are_pushed_and_bad_edits_refused(istiod: tuple[Istiod, Path, Path]) -> None:
    served, _, registry = istiod
    async with grpc.aio.insecure_channel(served.plain) as channel:
        call, cds = await _first_cds(channel)
        await call.write(discovery_pb2.DiscoveryRequest(type_url=cds.type_url, response_nonce=cds.nonce))

        registry.write_text(REGISTRY + "- {name: web-1, labels: {app: web}}\n  oops: [\n")
        deadline = time.monotonic() + 20
        while "registry refused" not in served.log():
            assert time.monotonic() < deadline, served.log()
            await asyncio.sleep(0.05)
        assert "mesh.yaml:" in served.log()

        registry.write_text(REGISTRY.replace("name: echo\n", "name: hello\n"))
        pushed = await asyncio.wait_for(call.read(), 20)
        names = _clusters(pushed)
        assert "outbound|80||hello.default.svc.cluster.local" in names
        assert "outbound|80||echo.default.svc.cluster.local" not in names
        call.cancel()


def test_broken_registry_stops_startup_with_line_and_field(tmp_path: Path) -> None:
    registry = tmp_path / "mesh.yaml"
    registry.write_text(REGISTRY.replace("port: 80,", "port: eighty,"))
    done = subprocess.run([ISTIOD_LOCAL, "serve", "--state-dir", str(tmp_path / "s"), "--grpc-addr", "127.0.0.1:0",
                           "--secure-grpc-addr", "127.0.0.1:0", "--registry", str(registry)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert f"{registry}:4: services[0].ports[0].port: must be an integer" in done.stderr, done.stderr

