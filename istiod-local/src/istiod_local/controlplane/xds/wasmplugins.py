"""WasmPlugins in the registry: Wasm extensions for the sidecars their selector picks.

Upstream's `extensions.istio.io/v1alpha1` WasmPlugin, in the registry's flattened shape (`name`/`namespace`
beside the spec's fields):

    wasmPlugins:
    - name: add-header
      namespace: default
      selector: {app: echo}               # spec.selector.matchLabels; absent: every workload of the namespace
      url: oci://registry.local/wasm/add-header:v1   # or http(s)://...; no scheme means oci://
      sha256: 9f86...                     # optional: the module's sha256 (HTTP) or the image's manifest digest
      imagePullPolicy: IfNotPresent       # UNSPECIFIED_POLICY | IfNotPresent | Always
      imagePullSecret: registry-creds     # optional: one of `wasmPullSecrets` in the plugin's namespace
      pluginConfig: {header: v1}          # any mapping; handed to the plugin as JSON
      pluginName: my-root-id              # optional root id
      phase: STATS                        # UNSPECIFIED_PHASE | AUTHN | AUTHZ | STATS
      priority: 10                        # optional; higher first within a phase
      failStrategy: FAIL_CLOSE            # FAIL_CLOSE | FAIL_OPEN | FAIL_RELOAD
      match: [{mode: SERVER}]             # optional traffic selectors: CLIENT | SERVER | CLIENT_AND_SERVER
    wasmPullSecrets:                       # the Kubernetes Secrets istiod would read (type dockerconfigjson)
    - {name: registry-creds, namespace: default, dockerconfigjson: '{"auths": {...}}'}

A plugin in the root namespace (`istio-system`, istiod's default `rootNamespace`) applies to the workloads of
every namespace its selector picks, as upstream's (after the workload's own namespace's, at equal priority).
HTTP plugins only (`type: HTTP`, the default); a NETWORK plugin is refused with its line. The resource
version istiod hands the agent is the plugin's own when given (`resourceVersion`), else a digest of its spec,
so that an edit is a new version as a Kubernetes write is.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from yaml.constructor import SafeConstructor

from istiod_local.controlplane.xds.yamlfields import Fields, choice, namespaced_items

ROOT_NAMESPACE = "istio-system"  # istiod's default meshConfig.rootNamespace: its plugins apply mesh-wide
PULL_POLICIES = ("UNSPECIFIED_POLICY", "IfNotPresent", "Always")
PHASES = ("UNSPECIFIED_PHASE", "AUTHN", "AUTHZ", "STATS")
FAIL_STRATEGIES = ("FAIL_CLOSE", "FAIL_OPEN", "FAIL_RELOAD")
MODES = ("CLIENT", "SERVER", "CLIENT_AND_SERVER", "UNDEFINED")
_PLUGIN = frozenset({"name", "namespace", "selector", "url", "sha256", "imagePullPolicy", "imagePullSecret",
                     "pluginConfig", "pluginName", "phase", "priority", "failStrategy", "match", "type",
                     "resourceVersion"})
_MATCH = frozenset({"mode", "ports"})
_SECRET = frozenset({"name", "namespace", "dockerconfigjson"})


@dataclass(frozen=True)
class WasmPlugin:
    name: str
    namespace: str
    url: str
    selector: Mapping[str, str] | None = None
    sha256: str = ""
    image_pull_policy: str = "UNSPECIFIED_POLICY"
    image_pull_secret: str = ""
    plugin_config: Mapping[str, Any] = field(default_factory=dict)
    plugin_name: str = ""
    phase: str = "UNSPECIFIED_PHASE"
    priority: int = 0
    fail_strategy: str = "FAIL_CLOSE"
    modes: tuple[str, ...] = ()
    resource_version: str = ""

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        if namespace != self.namespace and self.namespace != ROOT_NAMESPACE:
            return False
        return all(labels.get(k) == v for k, v in (self.selector or {}).items())

    def applies_to(self, mode: str) -> bool:
        """`mode` is CLIENT (outbound) or SERVER (inbound); no selector, or CLIENT_AND_SERVER, means both."""
        return not self.modes or any(m in (mode, "CLIENT_AND_SERVER", "UNDEFINED") for m in self.modes)


@dataclass(frozen=True)
class PullSecret:
    name: str
    namespace: str
    dockerconfigjson: str


def _plugin(f: Fields, name: str, namespace: str) -> WasmPlugin:
    url = f.string("url")
    if not url:
        f.fail(f.value_node("url"), "url", "is required")
    if "://" not in url:
        url = "oci://" + url
    if f.string("type", "HTTP") != "HTTP":
        f.fail(f.value_node("type"), "type", "only HTTP plugins are served")
    config: dict[str, Any] = {}
    if f.has("pluginConfig"):
        value = SafeConstructor().construct_object(f.value_node("pluginConfig"), deep=True)
        if not isinstance(value, dict):
            f.fail(f.value_node("pluginConfig"), "pluginConfig", "must be a mapping")
        config = dict(value)
    modes = []
    for path, node in f.items("match"):
        modes.append(choice(Fields(node, path, f.source, _MATCH), "mode", MODES, "CLIENT_AND_SERVER"))
    sha = f.string("sha256", "").lower()
    if sha and (len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha)):
        f.fail(f.value_node("sha256"), "sha256", "must be 64 hex digits")
    plugin = WasmPlugin(
        name=name, namespace=namespace, url=url,
        selector=f.string_map("selector") if f.has("selector") else None,
        sha256=sha,
        image_pull_policy=choice(f, "imagePullPolicy", PULL_POLICIES, "UNSPECIFIED_POLICY"),
        image_pull_secret=f.string("imagePullSecret", ""),
        plugin_config=config,
        plugin_name=f.string("pluginName", ""),
        phase=choice(f, "phase", PHASES, "UNSPECIFIED_PHASE"),
        priority=f.integer("priority", 0),
        fail_strategy=choice(f, "failStrategy", FAIL_STRATEGIES, "FAIL_CLOSE"),
        modes=tuple(modes),
    )
    version = f.string("resourceVersion", "")
    if not version:
        spec = json.dumps([plugin.url, plugin.sha256, plugin.image_pull_policy, plugin.image_pull_secret,
                           plugin.plugin_config, plugin.plugin_name, plugin.phase, plugin.fail_strategy],
                          sort_keys=True, default=str)
        version = hashlib.sha256(spec.encode()).hexdigest()[:12]
    return WasmPlugin(**{**plugin.__dict__, "resource_version": version})


def parse_wasm_plugins(top: Fields) -> tuple[WasmPlugin, ...]:
    return tuple(_plugin(f, name, namespace)
                 for f, name, namespace in namespaced_items(top, "wasmPlugins", _PLUGIN, "wasm plugin"))


def parse_pull_secrets(top: Fields) -> tuple[PullSecret, ...]:
    out = []
    for f, name, namespace in namespaced_items(top, "wasmPullSecrets", _SECRET, "pull secret"):
        text = f.string("dockerconfigjson")
        try:
            json.loads(text)
        except ValueError as exc:
            f.fail(f.value_node("dockerconfigjson"), "dockerconfigjson", f"is not JSON: {exc}")
        out.append(PullSecret(name, namespace, text))
    return tuple(out)
