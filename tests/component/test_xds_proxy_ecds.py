"""The XDS proxy's ECDS path with the Wasm cache's hook, against a real ADS server and client (SotW and Delta).

An ECDS push whose module is slow to download does not hold up a CDS push that follows it; the ECDS push then
arrives with the module as a local file, and the client's ACK reaches the server as Envoy's own. An ECDS push
that does not decode is NACKed by the agent to the server (INTERNAL, the reason) and never reaches the client.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from envoy.config.core.v3 import extension_pb2
from envoy.extensions.filters.http.wasm.v3 import wasm_pb2
from google.protobuf import any_pb2
from support import eventually
from test_xds_proxy_ads import AdsClient, FakeAds, clusters
from wasm_modules import header_module, sha256
from wasm_registry import ModuleServer

from istio_agent.protos import typeurls
from istio_agent.wasm.cache import WasmModuleCache
from istio_agent.wasm.ecds import EcdsRewriter
from istio_agent.wasm.options import WasmOptions
from istio_agent.xds import XdsProxy, XdsProxyHooks, XdsProxyOptions
from istio_agent.xds.upstream import UpstreamSettings
from istiod_local.controlplane.xds.generators.extensions import resource_name, wasm_config
from istiod_local.controlplane.xds.wasmplugins import WasmPlugin


def first_config(response: Any) -> extension_pb2.TypedExtensionConfig:
    item = response.resources[0]
    config = extension_pb2.TypedExtensionConfig()
    (item.resource if hasattr(item, "resource") else item).Unpack(config)
    return config


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_slow_module_holds_up_no_other_type_and_bad_ecds_is_nacked(tmp_path: Path, delta: bool) -> None:
    module = header_module()
    with ModuleServer() as modules:
        modules.files["/slow.wasm"] = module
        modules.delay["/slow.wasm"] = 1.5
        plugin = WasmPlugin("slow", "default", modules.url("/slow.wasm"), sha256=sha256(module),
                            resource_version="1")
        ads = FakeAds({typeurls.EXTENSION_CONFIG: [(resource_name(plugin), wasm_config(plugin, None))],
                       typeurls.CLUSTER: clusters(2)})
        port = await ads.start()
        cache = WasmModuleCache(WasmOptions(cache_dir=tmp_path / "cache"))
        socket = tmp_path / "XDS"
        proxy = XdsProxy(XdsProxyOptions(socket, UpstreamSettings(f"127.0.0.1:{port}", workdir=tmp_path,
                                                                  insecure=True)),
                         XdsProxyHooks(ecds=EcdsRewriter(cache)))
        await proxy.start()
        client = AdsClient(socket, delta)
        try:
            await client.subscribe(typeurls.EXTENSION_CONFIG)
            await client.subscribe(typeurls.CLUSTER)
            first = await client.read()
            assert first.type_url == typeurls.CLUSTER, "CDS is not held up by the ECDS download"
            await client.ack(first)
            second = await client.read()
            assert second.type_url == typeurls.EXTENSION_CONFIG
            wasm = wasm_pb2.Wasm()
            first_config(second).typed_config.Unpack(wasm)
            local = Path(wasm.config.vm_config.code.local.filename)
            assert local.read_bytes() == module and local.is_relative_to(tmp_path / "cache")
            await client.ack(second)
            await eventually(lambda: any(r.response_nonce == second.nonce and not r.HasField("error_detail")
                                         for r in ads.requests_of(typeurls.EXTENSION_CONFIG)), "the client's ACK")

            broken = extension_pb2.TypedExtensionConfig(name="broken", typed_config=any_pb2.Any(
                type_url="type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm", value=b"\xff\xff"))
            ads.push(typeurls.EXTENSION_CONFIG, [("broken", broken)])
            nack = await eventually(lambda: next((r for r in ads.requests_of(typeurls.EXTENSION_CONFIG)
                                                  if r.HasField("error_detail")), None), "the agent's NACK")
            assert nack.error_detail.code == 13 and "unmarshal" in nack.error_detail.message
            if not delta:
                assert nack.version_info == second.version_info, "the last version Envoy ACKed"
            with pytest.raises(asyncio.TimeoutError):
                await client.read(timeout=0.5)
            assert proxy.stats.nacked == 1
        finally:
            await client.close()
            await proxy.stop()
            await cache.stop()
            await ads.stop()
