"""istiod-local's WasmPlugins: the registry section (errors name line and field), the HTTP filters by phase
and mode, and the ECDS resources as upstream's istiod builds them (remote code, the agent's variables)."""

from __future__ import annotations

import pytest
from envoy.config.core.v3 import extension_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.http.wasm.v3 import wasm_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2

from istio_agent.protos import typeurls
from istiod_local.controlplane.xds.generators import ProxyContext, SidecarGenerator
from istiod_local.controlplane.xds.mesh import build_snapshot
from istiod_local.controlplane.xds.proxy import parse_node_id
from istiod_local.controlplane.xds.registry import parse_registry
from istiod_local.controlplane.xds.yamlfields import RegistryError

BASE = """
services:
- {name: echo, selector: {app: echo}, ports: [{name: http, port: 80, targetPort: 8080, protocol: HTTP}]}
workloads:
- {name: echo-1, serviceAccount: echo, labels: {app: echo}, ip: 10.244.0.5}
wasmPullSecrets:
- {name: creds, namespace: default, dockerconfigjson: '{"auths": {}}'}
wasmPlugins:
- {name: stats, selector: {app: echo}, url: registry.local/wasm/stats:v1, phase: STATS, match: [{mode: SERVER}],
   imagePullSecret: creds, imagePullPolicy: Always}
- {name: authn, url: "http://modules.local/authn.wasm", phase: AUTHN, pluginConfig: {k: v}, failStrategy: FAIL_OPEN}
- {name: other, selector: {app: nobody}, url: "http://modules.local/x.wasm"}
"""
ECHO = "sidecar~10.244.0.5~echo-1.default~default.svc.cluster.local"
PREFIX = "extensions.istio.io/trafficextension/default."
MARK = "~istio-translated-wasmplugin"


def context(text: str = BASE) -> ProxyContext:
    return ProxyContext.build(build_snapshot(1, parse_registry(text)), parse_node_id(ECHO, {}))


def http_filter_names(listener: listener_pb2.Listener) -> list[str]:
    hcm = hcm_pb2.HttpConnectionManager()
    chain = next(c for c in listener.filter_chains
                 if any(f.name == "envoy.filters.network.http_connection_manager" for f in c.filters))
    chain.filters[-1].typed_config.Unpack(hcm)
    return [f.name for f in hcm.http_filters]


def test_filters_by_phase_and_mode() -> None:
    listeners = {}
    for name, packed in SidecarGenerator().generate(typeurls.LISTENER, context(), None).items():
        listeners[name] = listener_pb2.Listener()
        packed.Unpack(listeners[name])
    inbound = http_filter_names(listeners["virtualInbound"])
    assert inbound[0] == PREFIX + "authn" + MARK
    assert inbound[-2:] == [PREFIX + "stats" + MARK, "envoy.filters.http.router"]
    outbound = http_filter_names(listeners["0.0.0.0_80"])
    assert PREFIX + "stats" + MARK not in outbound, "a SERVER plugin stays off outbound chains"
    assert outbound[0] == PREFIX + "authn" + MARK and PREFIX + "other" + MARK not in outbound


def test_ecds_resources_carry_the_remote_code_and_the_agents_variables() -> None:
    resources = SidecarGenerator().generate(typeurls.EXTENSION_CONFIG, context(), [PREFIX + "stats" + MARK])
    [(name, packed)] = resources.items()
    assert name == PREFIX + "stats" + MARK
    config = extension_pb2.TypedExtensionConfig()
    packed.Unpack(config)
    wasm = wasm_pb2.Wasm()
    config.typed_config.Unpack(wasm)
    vm = wasm.config.vm_config
    assert vm.code.remote.http_uri.uri == "oci://registry.local/wasm/stats:v1"
    assert vm.code.remote.http_uri.cluster == "_" and vm.code.remote.http_uri.timeout.seconds == 30
    env = dict(vm.environment_variables.key_values)
    assert env["ISTIO_META_WASM_IMAGE_PULL_SECRET"] == '{"auths": {}}'
    assert env["ISTIO_META_WASM_IMAGE_PULL_POLICY"] == "Always"
    assert env["ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION"]
    assert len(SidecarGenerator().generate(typeurls.EXTENSION_CONFIG, context(), None)) == 2


def test_an_edit_is_a_new_resource_version() -> None:
    def version(text: str) -> str:
        return parse_registry(text).wasm_plugins[1].resource_version

    assert version(BASE) != version(BASE.replace("{k: v}", "{k: w}"))


@pytest.mark.parametrize(("change", "field"), [
    ("phase: AUTHN,", "wasmPlugins[1].phase"), ("type: NETWORK,", "wasmPlugins[1].type"),
    ("sha256: abc,", "wasmPlugins[1].sha256"),
])
def test_bad_plugins_name_their_field(change: str, field: str) -> None:
    text = BASE.replace("{name: authn,", "{name: authn, " + change.replace("AUTHN", "EARLY"))
    with pytest.raises(RegistryError) as caught:
        parse_registry(text)
    assert field in str(caught.value)


def test_a_root_namespace_plugin_applies_to_every_namespace_after_the_workloads_own() -> None:
    text = BASE + """\
- {name: global, namespace: istio-system, url: "http://modules.local/g.wasm", phase: AUTHN}
- {name: elsewhere, namespace: other, url: "http://modules.local/e.wasm", phase: AUTHN}
"""
    names = list(SidecarGenerator().generate(typeurls.EXTENSION_CONFIG, context(text), None))
    root = "extensions.istio.io/trafficextension/istio-system.global" + MARK
    assert root in names and not any("other.elsewhere" in n for n in names)
    listener = listener_pb2.Listener()
    SidecarGenerator().generate(typeurls.LISTENER, context(text), None)["virtualInbound"].Unpack(listener)
    inbound = http_filter_names(listener)
    assert inbound.index(PREFIX + "authn" + MARK) < inbound.index(root), "the workload's own namespace first"
