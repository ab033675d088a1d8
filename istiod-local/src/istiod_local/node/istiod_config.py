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

Pods, Services and EndpointSlices need nothing here: istiod reads them from
istiod-local's Kubernetes API. VMs (WorkloadGroups, WorkloadEntries) and
WasmPlugins are not translated (`untranslated` names them).

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


def _takes_mtls(registry: Registry, service: Service) -> bool:
    if registry.peer_authentication.get(service.namespace) == "DISABLE" or not service.selector:
        return False
    selected = [w for w in registry.workloads if w.namespace == service.namespace
                and all(w.labels.get(k) == v for k, v in service.selector.items())]
    return bool(selected) and all(w.sidecar != "none" for w in selected)


def _host(host: str, namespace: str, suffix: str) -> str:
    """A DestinationRule's host as istiod reads it (a name without a dot is a service of its namespace)."""
    return f"{host}.{namespace}.svc.{suffix}" if "." not in host and host != "*" else host


def _overridden(user: Iterable[Mapping[str, Any]], suffix: str) -> tuple[set[str], set[str], set[tuple[str, str]]]:
    """What the user's resources decide: namespaces (PeerAuthentication), hosts (DestinationRule), and
    ServiceEntry (namespace, name)."""
    namespaces, hosts, entries = set(), set(), set()
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
    return namespaces, hosts, entries


def istio_config(registry: Registry, user: Iterable[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """The Istio resources istiod needs for what the registry says beyond pods and services, less what the
    user's own resources (`user`) decide."""
    namespaces, hosts, entries = _overridden(user, registry.domain_suffix)
    out = [peer_authentication(namespace, mode) for namespace, mode in sorted(registry.peer_authentication.items())
           if namespace not in namespaces]
    out += [service_entry(entry, i) for i, entry in enumerate(registry.service_entries)
            if (entry.namespace, entry.name) not in entries]
    for s in registry.services:
        host = f"{s.name}.{s.namespace}.svc.{registry.domain_suffix}"
        if host not in hosts and _takes_mtls(registry, s):
            out.append(istio_mutual(host, s.namespace, s.name))
    return out


def untranslated(registry: Registry) -> list[str]:
    """What of the registry the real istiod would not see (an empty list: all of it)."""
    found = []
    if registry.workload_groups or registry.workload_entries:
        found.append("VMs (workloadGroups, workloadEntries)")
    if registry.wasm_plugins:
        found.append("wasmPlugins")
    return found
