"""WasmPlugins as istiod serves them: HTTP filters that wait for ECDS, and the ECDS resources themselves.

Upstream's shape (pilot/pkg/model/extensions.go, networking/core/extension): each plugin a sidecar's workload
is selected by becomes an HTTP filter named after its resource, with `config_discovery` over ADS (Wasm or
RBAC types accepted, no initial fetch timeout: the listener waits for the config). The filter sits by phase:
AUTHN and AUTHZ first, STATS then UNSPECIFIED just before the router, higher priority first. Its ECDS
resource carries the Wasm code as a *remote* source (the URL, sha256, a 30 s timeout, the placeholder
cluster `_`): the agent fetches it and rewrites the source to a local file. The VM's environment holds what
only the agent reads: the resource version, the pull policy when set, and the pull secret's
dockerconfigjson (empty when the named secret does not exist).
"""

from __future__ import annotations

import json
from collections.abc import Collection

from envoy.config.core.v3 import base_pb2, config_source_pb2, extension_pb2, http_uri_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.http.wasm.v3 import wasm_pb2 as http_wasm_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.wasm.v3 import wasm_pb2
from google.protobuf import wrappers_pb2

from istiod_local.controlplane.xds.generators.base import ProxyContext, Resources, select
from istiod_local.controlplane.xds.generators.envoy import duration, pack
from istiod_local.controlplane.xds.generators.http import HCM_FILTER
from istiod_local.controlplane.xds.wasmplugins import WasmPlugin

RESOURCE_PREFIX = "extensions.istio.io/trafficextension/"
TRANSLATED_MARKER = "~istio-translated-wasmplugin"  # istiod's name for a WasmPlugin made a TrafficExtension
WASM_HTTP_TYPE = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
RBAC_HTTP_TYPE = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
SECRET_ENV = "ISTIO_META_WASM_IMAGE_PULL_SECRET"
POLICY_ENV = "ISTIO_META_WASM_IMAGE_PULL_POLICY"
RESOURCE_VERSION_ENV = "ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION"
_FAILURE_POLICIES = {"FAIL_OPEN": wasm_pb2.FAIL_OPEN, "FAIL_CLOSE": wasm_pb2.FAIL_CLOSED,
                     "FAIL_RELOAD": wasm_pb2.FAIL_RELOAD}
_EARLY, _LATE = ("AUTHN", "AUTHZ"), ("STATS", "UNSPECIFIED_PHASE")


def resource_name(plugin: WasmPlugin) -> str:
    return f"{RESOURCE_PREFIX}{plugin.namespace}.{plugin.name}{TRANSLATED_MARKER}"


def plugins_for(ctx: ProxyContext) -> list[WasmPlugin]:
    """The plugins that select this proxy's workload (its namespace's and the root namespace's), by priority
    (highest first), the workload's own namespace before the root namespace, then name."""
    workload = ctx.workload
    if workload is None:
        return []
    chosen = [p for p in ctx.snapshot.registry.wasm_plugins if p.selects(workload.namespace, workload.labels)]
    return sorted(chosen, key=lambda p: (-p.priority, p.namespace != workload.namespace, p.name))


def _filter(plugin: WasmPlugin) -> hcm_pb2.HttpFilter:
    source = config_source_pb2.ConfigSource(ads=config_source_pb2.AggregatedConfigSource(),
                                            resource_api_version=config_source_pb2.V3,
                                            initial_fetch_timeout=duration(0))
    return hcm_pb2.HttpFilter(name=resource_name(plugin), config_discovery=config_source_pb2.ExtensionConfigSource(
        config_source=source, type_urls=[WASM_HTTP_TYPE, RBAC_HTTP_TYPE]))


def add_wasm_filters(listener: listener_pb2.Listener, plugins: list[WasmPlugin], mode: str) -> None:
    """Put the plugins that apply to `mode` (SERVER inbound, CLIENT outbound) into every HTTP chain of `listener`."""
    chosen = [p for p in plugins if p.applies_to(mode)]
    if not chosen:
        return
    for chain in listener.filter_chains:
        for network_filter in chain.filters:
            if network_filter.name != HCM_FILTER:
                continue
            hcm = hcm_pb2.HttpConnectionManager()
            network_filter.typed_config.Unpack(hcm)
            filters = list(hcm.http_filters)
            early = [_filter(p) for phase in _EARLY for p in chosen if p.phase == phase]
            late = [_filter(p) for phase in _LATE for p in chosen if p.phase == phase]
            hcm.ClearField("http_filters")
            hcm.http_filters.extend([*early, *filters[:-1], *late, filters[-1]])  # the router stays last
            network_filter.typed_config.CopyFrom(pack(hcm))


def wasm_config(plugin: WasmPlugin, pull_secret: str | None) -> extension_pb2.TypedExtensionConfig:
    env = wasm_pb2.EnvironmentVariables()
    if plugin.image_pull_secret:
        env.key_values[SECRET_ENV] = pull_secret or ""
    if plugin.image_pull_policy != "UNSPECIFIED_POLICY":
        env.key_values[POLICY_ENV] = plugin.image_pull_policy
    env.key_values[RESOURCE_VERSION_ENV] = plugin.resource_version
    remote = base_pb2.RemoteDataSource(
        http_uri=http_uri_pb2.HttpUri(uri=plugin.url, cluster="_", timeout=duration(30)), sha256=plugin.sha256)
    config = wasm_pb2.PluginConfig(
        name=f"{plugin.namespace}.{plugin.name}{TRANSLATED_MARKER}", root_id=plugin.plugin_name,
        vm_config=wasm_pb2.VmConfig(runtime="envoy.wasm.runtime.v8", code=base_pb2.AsyncDataSource(remote=remote),
                                    environment_variables=env),
        failure_policy=_FAILURE_POLICIES[plugin.fail_strategy])
    if plugin.plugin_config:
        config.configuration.CopyFrom(pack(wrappers_pb2.StringValue(
            value=json.dumps(plugin.plugin_config, separators=(",", ":"), sort_keys=True))))
    return extension_pb2.TypedExtensionConfig(name=resource_name(plugin),
                                              typed_config=pack(http_wasm_pb2.Wasm(config=config)))


def build_extension_configs(ctx: ProxyContext, names: Collection[str] | None) -> Resources:
    """ECDS: the extension configs of this proxy's plugins (only those asked for, when names are given)."""
    secrets = {(s.namespace, s.name): s.dockerconfigjson for s in ctx.snapshot.registry.wasm_pull_secrets}
    resources = {resource_name(p): pack(wasm_config(p, secrets.get((p.namespace, p.image_pull_secret))))
                 for p in plugins_for(ctx)}
    return select(resources, names)
