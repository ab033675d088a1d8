"""The XDS proxy in front of istiod-local's own ADS server, over TLS with a service-account token.

istiod-local serves on its TLS port with its serving certificate (names
`istiod.istio-system.svc`, `localhost`) and refuses streams without a valid
token, as istiod does. The pod side is a working directory with the mounted
root and token at their pod paths. A grpc.aio ADS client plays Envoy on the
proxy's socket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.service.discovery.v3 import discovery_pb2
from support import eventually
from test_xds_proxy_ads import AdsClient

from istio_agent.protos import nds_pb2, typeurls
from istio_agent.xds import XdsProxy, XdsProxyHooks, XdsProxyOptions
from istio_agent.xds.upstream import UpstreamSettings
from istiod_local.controlplane.server import ControlPlane, ControlPlaneOptions
from istiod_local.controlplane.xds.ads import AdsServer
from istiod_local.controlplane.xds.auth import TokenAuthenticator
from istiod_local.controlplane.xds.registry import parse_registry

NODE = "sidecar~10.244.0.5~echo-1.default~default.svc.cluster.local"
METADATA = {"NAMESPACE": "default", "NAME": "echo-1", "SERVICE_ACCOUNT": "echo", "LABELS": {"app": "echo"}}
REGISTRY = """
services:
- name: echo
  selector: {app: echo}
  ports: [{name: http, port: 80, targetPort: 8080, protocol: HTTP}]
  clusterIP: 10.96.0.20
- name: db
  namespace: data
  selector: {app: db}
  ports: [{name: tcp, port: 5432}]
  clusterIP: 10.96.0.30
workloads:
- {name: echo-1, serviceAccount: echo, labels: {app: echo}, ip: 10.244.0.5}
- {name: db-1, namespace: data, serviceAccount: db, labels: {app: db}, ip: 10.244.0.6}
"""


@dataclass
class Mesh:
    ads: AdsServer
    proxy: XdsProxy
    pod: Path
    tables: list[nds_pb2.NameTable]


@contextlib.asynccontextmanager
async def istiod_and_proxy(tmp_path: Path, token: bool = True) -> AsyncIterator[Mesh]:
    plane = ControlPlane(ControlPlaneOptions(tmp_path / "state", grpc_addr="", secure_grpc_addr="127.0.0.1:0"))
    ads = AdsServer(parse_registry(REGISTRY), authenticator=TokenAuthenticator(plane.verifier))
    plane.add_service(ads.register)
    await plane.start()
    pod = tmp_path / "pod"
    root = pod / "var/run/secrets/istio/root-cert.pem"
    root.parent.mkdir(parents=True)
    root.write_text(plane.root_cert_pem)
    if token:
        token_file = pod / "var/run/secrets/tokens/istio-token"
        token_file.parent.mkdir(parents=True)
        token_file.write_text(plane.mint_token("default", "echo", "echo-1"))
    port = plane.secure_address.rsplit(":", 1)[1]
    tables: list[nds_pb2.NameTable] = []
    proxy = XdsProxy(XdsProxyOptions(
        socket_path=pod / "etc/istio/proxy/XDS",
        upstream=UpstreamSettings(f"localhost:{port}", workdir=pod),  # TLS, server name istiod.istio-system.svc
        dns_enabled=True,
    ), XdsProxyHooks(on_name_table=tables.append))
    await proxy.start()
    try:
        yield Mesh(ads, proxy, pod, tables)
    finally:
        await proxy.stop()
        await plane.stop(None)


async def _subscribe(client: AdsClient, type_url: str, first: bool = False) -> None:
    request: Any = (discovery_pb2.DeltaDiscoveryRequest if client.delta else discovery_pb2.DiscoveryRequest)(
        type_url=type_url
    )
    if first:
        request.node.id = NODE
        request.node.metadata.update(METADATA)
    await client.call.write(request)


def _names(response: Any, cls: Any) -> set[str]:
    if isinstance(response, discovery_pb2.DeltaDiscoveryResponse):
        return {r.name for r in response.resources}
    return {cls.FromString(a.value).name for a in response.resources}


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_istiod_local_config_through_proxy(tmp_path: Path, delta: bool) -> None:
    async with istiod_and_proxy(tmp_path) as mesh:
        client = AdsClient(mesh.proxy.options.socket_path, delta)
        try:
            await _subscribe(client, typeurls.CLUSTER, first=True)
            cds = await client.read()
            assert "outbound|80||echo.default.svc.cluster.local" in _names(cds, cluster_pb2.Cluster)
            await client.ack(cds)
            await _subscribe(client, typeurls.LISTENER)
            lds = await client.read()
            assert lds.type_url == typeurls.LISTENER
            assert {"virtualOutbound", "virtualInbound"} <= _names(lds, listener_pb2.Listener)
            await client.ack(lds)
            # istiod-local's name table reached the agent's callback, and its watch is ACKed, not NACKed.
            await eventually(lambda: mesh.tables, what="the name table")
            assert list(mesh.tables[0].table["echo.default.svc.cluster.local"].ips) == ["10.96.0.20"]

            def nds_acked() -> bool:
                watches = [c["watches"] for c in mesh.ads.connections()]
                return bool(watches) and all(typeurls.NAME_TABLE in w and not w[typeurls.NAME_TABLE]["nacked"]
                                             for w in watches)

            await eventually(nds_acked, what="istiod-local to record the NDS watch")
            # A registry change is pushed through the proxy: new clusters to the client, new table to the agent.
            mesh.ads.update_registry(parse_registry(REGISTRY.replace("name: db\n", "name: pg\n")))
            while True:
                pushed = await client.read()
                if pushed.type_url == typeurls.CLUSTER:
                    break
            names = _names(pushed, cluster_pb2.Cluster)
            gone = "outbound|5432||db.data.svc.cluster.local"
            assert gone in pushed.removed_resources if delta else gone not in names
            assert "outbound|5432||pg.data.svc.cluster.local" in names
            await eventually(lambda: "pg.data.svc.cluster.local" in mesh.tables[-1].table, what="the new table")
            assert mesh.proxy.stats.dropped == 0
        finally:
            await client.close()


async def test_missing_token_is_refused_upstream_and_passed_down(tmp_path: Path) -> None:
    async with istiod_and_proxy(tmp_path, token=False) as mesh:
        client = AdsClient(mesh.proxy.options.socket_path, delta=True)
        try:
            await _subscribe(client, typeurls.CLUSTER, first=True)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await asyncio.wait_for(client.call.read(), 10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "bearer token" in (refused.value.details() or "")
        finally:
            await client.close()
