"""ECDS as istiod-local serves a WasmPlugin (upstream's shape), converted as upstream's agent does:
remote code to a local file, agent variables stripped, fail-open/closed stand-ins, NACKs; the rewriter's
fast path and its metrics; the cache's fetch-once, restart and purge rules on virtual time."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from envoy.config.core.v3 import extension_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2
from envoy.extensions.filters.http.wasm.v3 import wasm_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2, json_format, struct_pb2, wrappers_pb2
from udpa.type.v1 import typed_struct_pb2

from istio_agent.clock import VirtualClock
from istio_agent.metrics import CollectorRegistry
from istio_agent.wasm.cache import WasmFetchError, WasmModuleCache
from istio_agent.wasm.core import convert
from istio_agent.wasm.core.cache_state import FetchRequest
from istio_agent.wasm.ecds import EcdsRewriter
from istio_agent.wasm.metrics import WasmMetrics
from istio_agent.wasm.options import WasmOptions
from istiod_local.controlplane.xds.generators.extensions import resource_name, wasm_config
from istiod_local.controlplane.xds.wasmplugins import WasmPlugin

MODULE = b"\x00asm\x01\x00\x00\x00" + b"\x01" * 24
URL = "http://modules.example/header.wasm"


def plugin(**overrides: Any) -> WasmPlugin:
    fields: dict[str, Any] = {"name": "header", "namespace": "default", "url": URL, "plugin_config": {"v": 1},
                              "resource_version": "7"}
    fields.update(overrides)
    return WasmPlugin(**fields)


def packed(config: extension_pb2.TypedExtensionConfig) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(config)
    return out


def response(*configs: extension_pb2.TypedExtensionConfig, delta: bool = False) -> bytes:
    if delta:
        delta_response = discovery_pb2.DeltaDiscoveryResponse(type_url=convert.EXTENSION_CONFIG_TYPE, nonce="n1")
        for config in configs:
            delta_response.resources.add(name=config.name, version="v", resource=packed(config))
        return delta_response.SerializeToString()
    return discovery_pb2.DiscoveryResponse(type_url=convert.EXTENSION_CONFIG_TYPE, nonce="n1", version_info="v2",
                                           resources=[packed(c) for c in configs]).SerializeToString()


def decoded(data: bytes, delta: bool = False) -> list[extension_pb2.TypedExtensionConfig]:
    if delta:
        items = [r.resource for r in discovery_pb2.DeltaDiscoveryResponse.FromString(data).resources]
    else:
        items = list(discovery_pb2.DiscoveryResponse.FromString(data).resources)
    out = []
    for item in items:
        config = extension_pb2.TypedExtensionConfig()
        item.Unpack(config)
        out.append(config)
    return out


LUA = extension_pb2.TypedExtensionConfig(name="not-wasm", typed_config=packed(
    extension_pb2.TypedExtensionConfig(name="inner")))


@pytest.mark.parametrize("delta", [False, True])
def test_remote_code_becomes_a_local_file_and_agent_variables_go(delta: bool) -> None:
    secret = '{"auths": {}}'
    config = wasm_config(plugin(image_pull_secret="creds", image_pull_policy="Always", sha256="ab" * 32), secret)
    ecds = convert.plan(response(config, LUA, delta=delta), delta)
    assert ecds.passed == 1 and not ecds.errors
    [(index, request)] = ecds.fetches
    assert request == FetchRequest(URL, "ab" * 32, resource_name(plugin()), "7", "Always", secret.encode(), 30.0,
                                   "default.header~istio-translated-wasmplugin")
    data, outcomes = convert.finish(ecds, {index: "/var/lib/istio/data/x/y.wasm"})
    assert [o.status for o in outcomes] == [convert.SUCCESS]
    rewritten, untouched = decoded(data, delta)
    assert untouched == LUA
    wasm = wasm_pb2.Wasm()
    rewritten.typed_config.Unpack(wasm)
    vm = wasm.config.vm_config
    assert vm.code.local.filename == "/var/lib/istio/data/x/y.wasm" and not vm.code.HasField("remote")
    assert not vm.HasField("environment_variables"), "the agent's ISTIO_META_* variables must not reach Envoy"
    configuration = wrappers_pb2.StringValue()
    assert wasm.config.configuration.Unpack(configuration) and json.loads(configuration.value) == {"v": 1}


@pytest.mark.parametrize(("strategy", "allow"), [("FAIL_CLOSE", False), ("FAIL_OPEN", True)])
def test_a_failed_fetch_becomes_the_plugins_fail_open_or_closed_rbac(strategy: str, allow: bool) -> None:
    ecds = convert.plan(response(wasm_config(plugin(fail_strategy=strategy), None)), False)
    data, [outcome] = convert.finish(ecds, {0: WasmFetchError("unreachable")})
    assert outcome.status == convert.FETCH_FAILURE and "unreachable" in outcome.error and outcome.fail_open is allow
    [config] = decoded(data)
    assert config.name == resource_name(plugin())
    rbac = rbac_pb2.RBAC()
    assert config.typed_config.Unpack(rbac)
    assert rbac.HasField("rules") is not allow
    assert rbac.rules_stat_prefix == ("wasm-default-allow" if allow else "wasm-default-deny")


def test_an_empty_pull_secret_fails_without_a_fetch() -> None:
    ecds = convert.plan(response(wasm_config(plugin(image_pull_secret="missing"), None)), False)
    assert ecds.fetches == []
    _, [outcome] = convert.finish(ecds, {})
    assert outcome.status == convert.FETCH_FAILURE and "missing image pulling secret" in outcome.error


def test_a_typed_struct_wasm_filter_is_converted_too() -> None:
    wasm = wasm_pb2.Wasm()
    wasm_config(plugin(), None).typed_config.Unpack(wasm)
    value = struct_pb2.Struct()
    value.update(json_format.MessageToDict(wasm))
    struct = typed_struct_pb2.TypedStruct(type_url=convert.HTTP_WASM_TYPE, value=value)
    config = extension_pb2.TypedExtensionConfig(name="ts", typed_config=packed(struct))  # type: ignore[arg-type]
    ecds = convert.plan(response(config), False)
    assert [r.url for _, r in ecds.fetches] == [URL]
    [out] = decoded(convert.finish(ecds, {0: "/m.wasm"})[0])
    assert out.typed_config.type_url == convert.HTTP_WASM_TYPE


def test_an_undecodable_resource_nacks_the_response_with_the_last_acked_version() -> None:
    bad = discovery_pb2.DiscoveryResponse(type_url=convert.EXTENSION_CONFIG_TYPE, nonce="n9", version_info="v9",
                                          resources=[any_pb2.Any(type_url=convert.EXTENSION_CONFIG_TYPE,
                                                                 value=b"\xff\xff")])
    ecds = convert.plan(bad.SerializeToString(), False)
    assert ecds.errors
    nack = discovery_pb2.DiscoveryRequest.FromString(convert.nack(ecds, "v1", ecds.errors))
    assert (nack.response_nonce, nack.version_info, nack.error_detail.code) == ("n9", "v1", 13)
    assert "unmarshal" in nack.error_detail.message


class StubCache:
    def __init__(self) -> None:
        self.metrics = WasmMetrics()
        self.asked: list[FetchRequest] = []
        self.release = asyncio.Event()

    async def get(self, request: FetchRequest) -> str:
        self.asked.append(request)
        await self.release.wait()
        if "bad" in request.url:
            raise WasmFetchError("checksum mismatch")
        return "/cache/" + request.url.rsplit("/", 1)[-1]


def test_the_rewriter_passes_pushes_without_wasm_and_fetches_the_others_at_once() -> None:
    clock = VirtualClock()
    cache = StubCache()
    rewriter = EcdsRewriter(cache)  # type: ignore[arg-type]
    plain = response(LUA)
    assert not rewriter.needs_rewrite(plain)
    data = response(wasm_config(plugin(name="good"), None), wasm_config(plugin(name="bad", url=URL + "/bad"), None))
    assert rewriter.needs_rewrite(data)

    async def scenario() -> tuple[bytes, bool]:
        task = asyncio.ensure_future(rewriter.rewrite(data, False, "v1"))
        await asyncio.sleep(0.01)
        assert len(cache.asked) == 2, "every module is asked for at once"
        cache.release.set()
        return await task

    out, nack = clock.run(scenario())
    assert not nack
    good, bad = decoded(out)
    assert good.typed_config.type_url == convert.HTTP_WASM_TYPE
    assert bad.typed_config.type_url.endswith("rbac.v3.RBAC")
    assert cache.metrics.conversions.get(convert.SUCCESS) == 1
    assert cache.metrics.conversions.get(convert.FETCH_FAILURE) == 1


class CountingFetcher:
    def __init__(self, module: bytes) -> None:
        self.module, self.calls = module, 0

    async def fetch(self, url: str, limit: int) -> bytes:
        self.calls += 1
        await asyncio.sleep(1)
        return self.module


def cache_at(tmp_path: Path, clock: VirtualClock, fetcher: CountingFetcher) -> WasmModuleCache:
    options = WasmOptions(cache_dir=tmp_path, purge_interval=3600, module_expiry=24 * 3600)
    cache = WasmModuleCache(options, WasmMetrics(CollectorRegistry()), clock)
    cache._fetchers = (fetcher, None)  # type: ignore[assignment]
    return cache


def request(policy: str = "IfNotPresent", version: str = "1", checksum: str = "") -> FetchRequest:
    return FetchRequest(URL, checksum, "r", version, policy, None, 30.0, "p")


def test_one_fetch_for_concurrent_requests_a_restart_keeps_the_module_and_expiry_purges(tmp_path: Path) -> None:
    clock, fetcher = VirtualClock(), CountingFetcher(MODULE)

    async def first_run() -> list[str]:
        cache = cache_at(tmp_path, clock, fetcher)
        await cache.start()
        try:
            return list(await asyncio.gather(*(cache.get(request()) for _ in range(5))))
        finally:
            await cache.stop()

    paths = clock.run(first_run())
    assert fetcher.calls == 1 and len(set(paths)) == 1 and Path(paths[0]).read_bytes() == MODULE
    assert Path(paths[0]).is_relative_to(tmp_path)

    async def after_restart() -> tuple[str, int, int, bool]:
        cache = cache_at(tmp_path, clock, fetcher)
        await cache.start()
        try:
            again = await cache.get(request())  # IfNotPresent: from disk
            calls = fetcher.calls
            await cache.get(request("Always", version="2"))  # a new version with Always: fetched
            refetched = fetcher.calls
            await asyncio.sleep(24 * 3600 + 2 * 3600)  # unused past the expiry: the next purge removes it
            return again, calls, refetched, Path(again).exists()
        finally:
            await cache.stop()

    clock = VirtualClock()  # the restarted agent's (a clock runs one scenario)
    again, calls, refetched, still_there = clock.run(after_restart())
    assert again == paths[0] and calls == 1
    assert refetched == 2
    assert not still_there


def test_a_checksum_mismatch_names_both_digests(tmp_path: Path) -> None:
    clock, fetcher = VirtualClock(), CountingFetcher(MODULE)

    async def scenario() -> str:
        cache = cache_at(tmp_path, clock, fetcher)
        try:
            await cache.get(request(checksum="0" * 64))
        except WasmFetchError as exc:
            assert cache.metrics.remote_fetches.get("checksum_mismatched") == 1
            return str(exc)
        return ""

    message = clock.run(scenario())
    assert "0" * 64 in message and hashlib.sha256(MODULE).hexdigest() in message
    assert not list(tmp_path.rglob("*.wasm"))
