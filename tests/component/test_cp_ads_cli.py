"""`istiod-local serve --registry`: ADS on the CA's ports, token-checked on TLS, reloading the registry file."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import struct_pb2
from launchers import IstiodLocal, RegistryFile, istiod_local_cli
from support import eventually

from istio_agent.protos import typeurls

REGISTRY = """\
services:
- name: echo
  selector: {app: echo}
  ports: [{name: http, port: 80, targetPort: 8080}]
workloads:
- {name: echo-1, serviceAccount: echo, labels: {app: echo}, ip: 10.244.0.5}
"""
NODE_META = {"NAMESPACE": "default", "SERVICE_ACCOUNT": "sleep"}


@pytest.fixture
def registry(tmp_path: Path) -> RegistryFile:
    """This module's registry, served by the tier's `istiod` fixture."""
    return RegistryFile(tmp_path / "mesh.yaml", REGISTRY)


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


def _tls_channel(istiod: IstiodLocal) -> grpc.aio.Channel:
    creds = grpc.ssl_channel_credentials(root_certificates=istiod.root_pem())
    return grpc.aio.secure_channel(istiod.secure, creds,
                                   options=[("grpc.ssl_target_name_override", "istiod.istio-system.svc")])


async def test_ads_on_both_ports_with_tokens_on_tls(istiod: IstiodLocal) -> None:
    async with grpc.aio.insecure_channel(istiod.plaintext) as channel:
        call, cds = await _first_cds(channel)
        assert "outbound|80||echo.default.svc.cluster.local" in _clusters(cds)
        call.cancel()

    async with _tls_channel(istiod) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _first_cds(channel)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _first_cds(channel, [("authorization", f"Bearer {istiod.token(service_account='other')}")])
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "service account" in (info.value.details() or "")
        call, cds = await _first_cds(channel, [("authorization", f"Bearer {istiod.token(service_account='sleep')}")])
        assert "outbound|80||echo.default.svc.cluster.local" in _clusters(cds)
        call.cancel()


async def test_registry_file_changes_are_pushed_and_bad_edits_refused(
        istiod: IstiodLocal, registry: RegistryFile) -> None:
    async with grpc.aio.insecure_channel(istiod.plaintext) as channel:
        call, cds = await _first_cds(channel)
        await call.write(discovery_pb2.DiscoveryRequest(type_url=cds.type_url, response_nonce=cds.nonce))

        registry.write(REGISTRY + "- {name: web-1, labels: {app: web}}\n  oops: [\n")
        await eventually(lambda: "registry refused" in istiod.log_text(), "istiod-local to refuse the bad edit")
        assert "mesh.yaml:" in istiod.log_text()

        registry.write(REGISTRY.replace("name: echo\n", "name: hello\n"))
        pushed = await asyncio.wait_for(call.read(), 20)
        names = _clusters(pushed)
        assert "outbound|80||hello.default.svc.cluster.local" in names
        assert "outbound|80||echo.default.svc.cluster.local" not in names
        call.cancel()


def test_broken_registry_stops_startup_with_line_and_field(tmp_path: Path) -> None:
    registry = tmp_path / "mesh.yaml"
    registry.write_text(REGISTRY.replace("port: 80,", "port: eighty,"))
    done = istiod_local_cli("serve", "--grpc-addr", "127.0.0.1:0", "--secure-grpc-addr", "127.0.0.1:0",
                            "--registry", str(registry), state_dir=tmp_path / "s", check=False)
    assert done.returncode != 0
    assert f"{registry}:4: services[0].ports[0].port: must be an integer" in done.stderr, done.stderr

