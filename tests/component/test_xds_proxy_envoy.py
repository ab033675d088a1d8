"""A real Envoy fetching its config through the XDS proxy (ADS over the `<configPath>/XDS` pipe).

Envoy's bootstrap points ADS at a static `xds-grpc` cluster with a `pipe`
address and HTTP/2, as the agent's bootstrap does. The proof is Envoy's own
admin `/config_dump`: the clusters and listener served upstream are active in
Envoy, and Envoy ACKed them upstream; the name table went to the agent's
callback instead. Then istiod goes away and comes back with new clusters, and
Envoy's own reconnect picks them up through a fresh upstream stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from google.protobuf import message as pb_message
from needs import need
from support import VENV_BIN, eventually, stop_process
from test_xds_proxy_ads import NODE, FakeAds, clusters, name_table

from istio_agent.protos import nds_pb2, typeurls
from istio_agent.xds import XdsProxy, XdsProxyHooks, XdsProxyOptions
from istio_agent.xds.upstream import UpstreamSettings

ENVOY = VENV_BIN / "envoy"


def _listener() -> listener_pb2.Listener:
    listener = listener_pb2.Listener(name="test-listener")
    listener.address.socket_address.address = "127.0.0.1"
    listener.address.socket_address.port_value = 0
    tcp = listener.filter_chains.add().filters.add(name="envoy.filters.network.tcp_proxy")
    tcp.typed_config.Pack(tcp_proxy_pb2.TcpProxy(stat_prefix="test", cluster=clusters(1)[0][0]))
    return listener


def _bootstrap(socket: Path, delta: bool) -> dict[str, Any]:
    ads_source = {"ads": {}, "resource_api_version": "V3"}
    return {
        "node": {"id": NODE, "cluster": "echo.default"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "dynamic_resources": {
            "ads_config": {
                "api_type": "DELTA_GRPC" if delta else "GRPC",
                "transport_api_version": "V3",
                "set_node_on_first_message_only": True,
                "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}],
            },
            "cds_config": ads_source,
            "lds_config": ads_source,
        },
        "static_resources": {
            "clusters": [
                {
                    "name": "xds-grpc",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": {
                        "cluster_name": "xds-grpc",
                        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": str(socket)}}}}]}],
                    },
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                            "explicit_http_config": {"http2_protocol_options": {}},
                        }
                    },
                }
            ]
        },
    }


class Envoy:
    """A real Envoy process with its admin on an ephemeral port."""

    def __init__(self, workdir: Path, bootstrap: dict[str, Any]) -> None:
        self.workdir = workdir
        config = workdir / "envoy.json"
        config.write_text(json.dumps(bootstrap))
        self.admin_file = workdir / "admin-address"
        self.log = (workdir / "envoy.log").open("wb")
        self.process = subprocess.Popen(
            [
                str(ENVOY), "-c", str(config), "--admin-address-path", str(self.admin_file),
                "--disable-hot-restart", "--concurrency", "1", "-l", "warning",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.admin = ""

    async def wait_admin(self) -> None:
        def ready() -> str:
            assert self.process.poll() is None, f"envoy exited: {(self.workdir / 'envoy.log').read_text()}"
            return self.admin_file.read_text().strip() if self.admin_file.exists() else ""

        self.admin = await eventually(ready, what="Envoy's admin address")

    async def config_dump(self) -> dict[str, Any]:
        def fetch() -> dict[str, Any]:
            with urllib.request.urlopen(f"http://{self.admin}/config_dump", timeout=5) as response:
                return dict(json.load(response))

        return await asyncio.to_thread(fetch)

    async def active(self) -> tuple[set[str], set[str]]:
        """Names of the dynamic clusters and listeners Envoy has accepted."""
        dump = await self.config_dump()
        cluster_names: set[str] = set()
        listener_names: set[str] = set()
        for config in dump["configs"]:
            for c in config.get("dynamic_active_clusters", ()):
                cluster_names.add(c["cluster"]["name"])
            for listener in config.get("dynamic_listeners", ()):
                if "active_state" in listener:
                    listener_names.add(listener["name"])
        return cluster_names, listener_names

    def stop(self) -> None:
        stop_process(self.process)
        self.log.close()


@contextlib.asynccontextmanager
async def envoy_through_proxy(tmp_path: Path, delta: bool) -> AsyncIterator[tuple[FakeAds, XdsProxy, Envoy,
                                                                                  list[nds_pb2.NameTable]]]:
    need(ENVOY.exists(), f"needs the envoy binary at {ENVOY}")
    resources: dict[str, list[tuple[str, pb_message.Message]]] = {
        typeurls.CLUSTER: clusters(3),
        typeurls.LISTENER: [("test-listener", _listener())],
        typeurls.NAME_TABLE: [("", name_table())],
    }
    ads = FakeAds(resources)
    port = await ads.start()
    tables: list[nds_pb2.NameTable] = []
    socket = tmp_path / "etc/istio/proxy/XDS"
    proxy = XdsProxy(
        XdsProxyOptions(
            socket_path=socket,
            upstream=UpstreamSettings(f"127.0.0.1:{port}", workdir=tmp_path, insecure=True, dial_timeout=1.0),
            dns_enabled=True,
        ),
        XdsProxyHooks(on_name_table=tables.append),
    )
    await proxy.start()
    envoy = Envoy(tmp_path, _bootstrap(socket, delta))
    try:
        await envoy.wait_admin()
        yield ads, proxy, envoy, tables
    finally:
        envoy.stop()
        await proxy.stop()
        await ads.stop()


def _names(count: int, prefix: str = "svc") -> set[str]:
    return {name for name, _ in clusters(count, prefix)}


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_envoy_gets_config_through_proxy(tmp_path: Path, delta: bool) -> None:
    async with envoy_through_proxy(tmp_path, delta) as (ads, proxy, envoy, tables):
        async def accepted() -> bool:
            cluster_names, listener_names = await envoy.active()
            return cluster_names == _names(3) and listener_names == {"test-listener"}

        await eventually(accepted, "Envoy to accept the clusters and the listener", 15.0, interval=0.05)
        # Envoy ACKed CDS and LDS upstream (through the proxy), without errors.
        for type_url in (typeurls.CLUSTER, typeurls.LISTENER):
            acks = [r for r in ads.requests_of(type_url, delta) if r.response_nonce]
            assert acks and not any(r.HasField("error_detail") for r in acks), type_url
        # The name table went to the agent (and was ACKed by it), never to Envoy.
        await eventually(lambda: tables, what="the name table")
        assert tables[0] == name_table()
        nds = ads.requests_of(typeurls.NAME_TABLE, delta)
        assert any(r.response_nonce for r in nds)
        dump = json.dumps(await envoy.config_dump())
        assert "istio.networking.nds" not in dump
        assert proxy.stats.consumed == 1


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_envoy_reconnects_after_istiod_restart(tmp_path: Path, delta: bool) -> None:
    async with envoy_through_proxy(tmp_path, delta) as (ads, proxy, envoy, _tables):
        async def first() -> bool:
            return (await envoy.active())[0] == _names(3)

        await eventually(first, "the first clusters", 15.0, interval=0.05)
        port = ads.port
        failures = proxy.stats.upstream_failures
        await ads.stop()
        await eventually(lambda: proxy.stats.upstream_failures > failures, what="the upstream failure")
        ads.resources[typeurls.CLUSTER] = clusters(2, prefix="after-restart")
        await ads.start(port)

        async def second() -> bool:
            return (await envoy.active())[0] == _names(2, "after-restart")

        await eventually(second, "Envoy to reconnect and get the new clusters", 30.0, interval=0.05)
        assert proxy.stats.streams >= 2

