"""The registry's Istio config as Istio resources, for the real istiod's `--configDir` (pure).

istiod-local reads PeerAuthentication modes and ServiceEntries from its
registry file; the real istiod reads Istio config from files of Istio
resources. So that the same registry gives both the same mesh, this writes:

- a PeerAuthentication `default` per namespace with a mode (`mtls.mode`);
- a ServiceEntry per registry entry (`MESH_EXTERNAL`: the registry's entries
  name things outside the mesh; its STATIC endpoints as `endpoints`);
- a DestinationRule with `ISTIO_MUTUAL` for each service whose pods all take
  mTLS (every selected workload injected, its namespace not DISABLE). Sidecar
  clients get mTLS there anyway (auto mTLS); a proxyless gRPC client gets it
  only from such a rule, since istiod's gRPC generator has no auto mTLS, while
  istiod-local gives proxyless clients mTLS wherever the endpoint takes it.

- a TrafficExtension per WasmPlugin (`traffic_extension`, below).

Pods, Services and EndpointSlices need nothing here: istiod reads them from
istiod-local's Kubernetes API. VMs (WorkloadGroups, WorkloadEntries) and
Wasm pull secrets are not translated (`untranslated` names them).

WasmPlugins reach istiod as TrafficExtensions. At the pinned version istiod
serves extensions from TrafficExtension resources only: in a cluster its
Kubernetes config source translates each WasmPlugin into one named
`<name>~istio-translated-wasmplugin` (`pilot/pkg/config/kube/extensions`),
but its file source (`--configDir`) has no such translation, so a
WasmPlugin file is read and never served. `traffic_extension` makes the
translation the cluster would, under the same name, so that istiod sends
Envoy what it sends for that WasmPlugin in a cluster (the ECDS resource
`extensions.istio.io/trafficextension/<ns>.<name>~istio-translated-wasmplugin`);
a user's WasmPlugin (`istioConfig:`) is given the same way
(`as_istiod_reads`), and fields the translation does not know are kept at
the spec's top level, where istiod's validation names them.

A user's own Istio config (`istioConfig:` of a mesh file, written beside
this by `istiod_userconfig.py`) takes precedence: a translated resource is
left out where the user's says the same thing, so istiod never sees two
answers to one question: the PeerAuthentication of a namespace with a
namespace-wide one (or one named `default`) of the user's, the
DestinationRule of a host the user has one for, a ServiceEntry of the same
name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from istiod_local.controlplane.xds.registry import Registry, Service, ServiceEntry
from istiod_local.controlplane.xds.wasmplugins import WasmPlugin


def peer_authentication(namespace: str, mode: str, name: str = "default") -> dict[str, Any]:
    """A PeerAuthentication: `mode` for the whole namespace."""
    return {"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"mtls": {"mode": mode}}}


def istio_mutual(host: str, namespace: str, name: str) -> dict[str, Any]:
    """A DestinationRule: ISTIO_MUTUAL to `host`."""
    return {"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"host": host, "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL"}}}}


def service_entry(entry: ServiceEntry, index: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "hosts": list(entry.hosts),
        "ports": [{"number": p.port, "name": p.name, "protocol": p.protocol,
                   **({"targetPort": p.target_port} if p.target_port and p.target_port != p.port else {})}
                  for p in entry.ports],
        "location": "MESH_EXTERNAL",
        "resolution": entry.resolution,
    }
    if entry.addresses:
        spec["addresses"] = list(entry.addresses)
    if entry.endpoints:
        spec["endpoints"] = [{"address": address} for address in entry.endpoints]
    return {"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
            "metadata": {"name": entry.name or f"registry-entry-{index}", "namespace": entry.namespace},
            "spec": spec}


TRANSLATED_MARKER = "~istio-translated-wasmplugin"  # istiod's own suffix for a WasmPlugin made a TrafficExtension
_TO_WASM_CONFIG = ("url", "sha256", "imagePullPolicy", "imagePullSecret", "verificationKey", "pluginConfig",
                   "pluginName", "failStrategy", "vmConfig", "type")
_PHASES = {"UNSPECIFIED_PHASE": "UNSPECIFIED"}  # WasmPlugin's PluginPhase -> TrafficExtension's ExecutionPhase


def traffic_extension(document: Mapping[str, Any]) -> dict[str, Any]:
    """A WasmPlugin (extensions.istio.io/v1alpha1) as the TrafficExtension istiod's cluster translation makes
    of it: the selector, targetRefs (a singular targetRef folded in), phase, priority and match beside the
    Wasm settings under `wasm`; the name marked as istiod marks it."""
    metadata = dict(document.get("metadata") or {})
    spec = dict(document.get("spec") or {})
    wasm = {key: spec.pop(key) for key in _TO_WASM_CONFIG if key in spec}
    target = spec.pop("targetRef", None)
    if target is not None and not spec.get("targetRefs"):
        spec["targetRefs"] = [target]
    if "phase" in spec:
        spec["phase"] = _PHASES.get(spec["phase"], spec["phase"])
    metadata["name"] = f"{metadata.get('name', '')}{TRANSLATED_MARKER}"
    return {"apiVersion": "extensions.istio.io/v1alpha1", "kind": "TrafficExtension", "metadata": metadata,
            "spec": {**spec, "wasm": wasm}}


def as_istiod_reads(document: Mapping[str, Any]) -> Mapping[str, Any]:
    """A user's resource as istiod's config directory must hold it: a WasmPlugin as its TrafficExtension."""
    return traffic_extension(document) if document.get("kind") == "WasmPlugin" else document


def wasm_plugin(plugin: WasmPlugin) -> dict[str, Any]:
    """A registry entry as the WasmPlugin it stands for (what a user would have written)."""
    spec: dict[str, Any] = {"url": plugin.url}
    if plugin.selector is not None:
        spec["selector"] = {"matchLabels": dict(plugin.selector)}
    optional = {"sha256": plugin.sha256, "imagePullSecret": plugin.image_pull_secret,
                "pluginName": plugin.plugin_name, "pluginConfig": dict(plugin.plugin_config),
                "imagePullPolicy": "" if plugin.image_pull_policy == "UNSPECIFIED_POLICY" else plugin.image_pull_policy,
                "phase": "" if plugin.phase == "UNSPECIFIED_PHASE" else plugin.phase,
                "priority": plugin.priority, "failStrategy": plugin.fail_strategy,
                "match": [{"mode": mode} for mode in plugin.modes]}
    spec.update({key: value for key, value in optional.items() if value})
    return {"apiVersion": "extensions.istio.io/v1alpha1", "kind": "WasmPlugin",
            "metadata": {"name": plugin.name, "namespace": plugin.namespace}, "spec": spec}


def _takes_mtls(registry: Registry, service: Service) -> bool:
    if registry.peer_authentication.get(service.namespace) == "DISABLE" or not service.selector:
        return False
    selected = [w for w in registry.workloads if w.namespace == service.namespace
                and all(w.labels.get(k) == v for k, v in service.selector.items())]
    return bool(selected) and all(w.sidecar != "none" for w in selected)


def _host(host: str, namespace: str, suffix: str) -> str:
    """A DestinationRule's host as istiod reads it (a name without a dot is a service of its namespace)."""
    return f"{host}.{namespace}.svc.{suffix}" if "." not in host and host != "*" else host


def _overridden(user: Iterable[Mapping[str, Any]],
                suffix: str) -> tuple[set[str], set[str], set[tuple[str, str]], set[tuple[str, str]]]:
    """What the user's resources decide: namespaces (PeerAuthentication), hosts (DestinationRule), ServiceEntry
    (namespace, name), and WasmPlugin or TrafficExtension (namespace, name as istiod reads it)."""
    namespaces, hosts, entries, extensions = set(), set(), set(), set()
    for document in user:
        metadata = document.get("metadata") or {}
        namespace, name = str(metadata.get("namespace", "default")), str(metadata.get("name", ""))
        spec = document.get("spec") or {}
        kind = document.get("kind")
        if kind == "PeerAuthentication" and (name == "default" or not (spec.get("selector") or {})):
            namespaces.add(namespace)
        elif kind == "DestinationRule":
            hosts.add(_host(str(spec.get("host", "")), namespace, suffix))
        elif kind == "ServiceEntry":
            entries.add((namespace, name))
        elif kind == "WasmPlugin":
            extensions.add((namespace, name + TRANSLATED_MARKER))
        elif kind == "TrafficExtension":
            extensions.add((namespace, name))
    return namespaces, hosts, entries, extensions


def istio_config(registry: Registry, user: Iterable[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """The Istio resources istiod needs for what the registry says beyond pods and services, less what the
    user's own resources (`user`) decide."""
    namespaces, hosts, entries, extensions = _overridden(user, registry.domain_suffix)
    out = [peer_authentication(namespace, mode) for namespace, mode in sorted(registry.peer_authentication.items())
           if namespace not in namespaces]
    out += [service_entry(entry, i) for i, entry in enumerate(registry.service_entries)
            if (entry.namespace, entry.name) not in entries]
    for s in registry.services:
        host = f"{s.name}.{s.namespace}.svc.{registry.domain_suffix}"
        if host not in hosts and _takes_mtls(registry, s):
            out.append(istio_mutual(host, s.namespace, s.name))
    out += [traffic_extension(wasm_plugin(p)) for p in registry.wasm_plugins
            if (p.namespace, p.name + TRANSLATED_MARKER) not in extensions]
    return out


def untranslated(registry: Registry) -> list[str]:
    """What of the registry the real istiod would not see (an empty list: all of it)."""
    found = []
    if registry.workload_groups or registry.workload_entries:
        found.append("VMs (workloadGroups, workloadEntries)")
    if registry.wasm_pull_secrets:
        found.append("wasmPullSecrets (istiod reads pull secrets from the Kubernetes API)")
    return found
