"""The mesh as the generators see it: registry plus the pods that connected, indexed.

A workload's address may be missing from the registry ("the local node
assigns one"); the pod's own proxy then tells us, through its node id, as a
kubelet would report a pod IP. A proxy whose pod is not in the registry at
all still counts as a workload (its labels and service account come from its
node metadata), so a selector can pick it up like a Kubernetes pod.

Workloads may share an address (hostNetwork pods, several workloads on one
VM), so a proxy is matched to its workload by the pod name and namespace of
its node id; its IP is only a fallback for a proxy whose name is not in the
registry, and only when it points at exactly one workload of that namespace
(`WorkloadIndex`). A shared address never makes two endpoints of one port.

`MeshSnapshot` is immutable and versioned: generators read it, the ADS server
swaps in a new one on every change. Its `memo` dict lets generators cache
proxy-independent output (clusters, endpoints) once per version.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from istiod_local.controlplane.xds.proxy import Proxy
from istiod_local.controlplane.xds.registry import Registry, Service, ServiceEntry, ServicePort
from istiod_local.controlplane.xds.workloadgroups import WorkloadEntry

KUBERNETES = "Kubernetes"
EXTERNAL = "External"
POD = "Pod"
WORKLOAD_ENTRY = "WorkloadEntry"
TLS_MODE_LABEL = "security.istio.io/tlsMode"
TLS_MODE_ISTIO = "istio"
TLS_MODE_DISABLED = "disabled"


@dataclass(frozen=True)
class Locality:
    region: str = ""
    zone: str = ""
    subzone: str = ""


def locality_from_labels(labels: Mapping[str, str]) -> Locality:
    """Kubernetes topology labels, or Istio's `istio-locality: region/zone/subzone`."""
    if labels.get("istio-locality"):
        parts = [*labels["istio-locality"].replace(".", "/").split("/"), "", ""]
        return Locality(parts[0], parts[1], parts[2])
    return Locality(labels.get("topology.kubernetes.io/region", ""), labels.get("topology.kubernetes.io/zone", ""),
                    labels.get("topology.istio.io/subzone", ""))


@dataclass(frozen=True)
class MeshWorkload:
    name: str
    namespace: str
    service_account: str
    labels: Mapping[str, str]
    ip: str
    registered: bool = True
    kind: str = POD
    # A WorkloadEntry with health checks enabled whose Healthy condition is not True: no endpoint.
    healthy: bool = True
    weight: int = 0
    locality_text: str = ""  # a WorkloadEntry's `locality` (region/zone/subzone), over its labels
    # Whether it can terminate Istio mTLS (upstream's endpoint TLSMode): "istio" or "disabled".
    tls_mode: str = TLS_MODE_ISTIO

    @property
    def locality(self) -> Locality:
        if self.locality_text:
            parts = [*self.locality_text.split("/"), "", ""]
            return Locality(parts[0], parts[1], parts[2])
        return locality_from_labels(self.labels)

    @classmethod
    def from_entry(cls, entry: WorkloadEntry, healthy: bool = True) -> MeshWorkload:
        # As upstream: the label when set, else mTLS exactly when the entry names a service account.
        implied = TLS_MODE_ISTIO if entry.service_account else TLS_MODE_DISABLED
        return cls(entry.name, entry.namespace, entry.service_account or "default", dict(entry.labels),
                   entry.address, True, WORKLOAD_ENTRY, healthy, entry.weight, entry.locality,
                   entry.labels.get(TLS_MODE_LABEL, implied))


@dataclass(frozen=True)
class ConnectedPod:
    """What a connected proxy says about its pod."""

    namespace: str
    name: str
    ip: str
    service_account: str
    labels: Mapping[str, str]

    @classmethod
    def from_proxy(cls, proxy: Proxy) -> ConnectedPod:
        return cls(proxy.namespace, proxy.pod_name, proxy.ip, proxy.service_account or "default", proxy.labels)


@dataclass(frozen=True)
class Endpoint:
    address: str
    port: int
    workload: MeshWorkload | None = None

    @property
    def locality(self) -> Locality:
        return self.workload.locality if self.workload else Locality()


@dataclass(frozen=True)
class ServiceView:
    """A Kubernetes service or one host of a service entry, as one hostname with ports."""

    hostname: str
    name: str
    namespace: str
    registry: str
    addresses: tuple[str, ...]
    ports: tuple[ServicePort, ...]
    resolution: str  # "EDS" for Kubernetes services, else the service entry's resolution
    service: Service | None = None
    entry: ServiceEntry | None = None

    @property
    def mesh_external(self) -> bool:
        return self.registry == EXTERNAL

    def port(self, number: int) -> ServicePort | None:
        return next((p for p in self.ports if p.port == number), None)


@dataclass(frozen=True)
class InboundTarget:
    """A service port served by the proxy's own workload."""

    service: ServiceView
    port: ServicePort


class _Named(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def ip(self) -> str: ...


W = TypeVar("W", bound=_Named)


class WorkloadIndex(Generic[W]):
    """Workloads by (namespace, name) and by (namespace, ip): how a proxy's own workload is found.

    `match` takes the workload named like the proxy's pod; failing that, the one workload of
    the namespace at one of the proxy's IPs. Several there (a shared address) is ambiguous:
    no match, rather than another workload's identity and inbound config.
    """

    def __init__(self, workloads: Iterable[W]) -> None:
        self._by_key: dict[tuple[str, str], W] = {}
        self._by_ip: dict[tuple[str, str], list[W]] = {}
        for w in workloads:
            self._by_key.setdefault((w.namespace, w.name), w)
            if w.ip:
                self._by_ip.setdefault((w.namespace, w.ip), []).append(w)

    def by_name(self, namespace: str, name: str) -> W | None:
        return self._by_key.get((namespace, name))

    def match(self, namespace: str, name: str, ips: Iterable[str]) -> W | None:
        named = self._by_key.get((namespace, name))
        if named is not None:
            return named
        at_ips = {id(w): w for ip in dict.fromkeys(ips) for w in self._by_ip.get((namespace, ip), ())}
        return next(iter(at_ips.values())) if len(at_ips) == 1 else None


def effective_workloads(registry: Registry, connected: Mapping[tuple[str, str], ConnectedPod],
                        entries: Iterable[tuple[WorkloadEntry, bool]] | None = None) -> tuple[MeshWorkload, ...]:
    """The registry's workloads (addresses learned from their connected pods), its WorkloadEntries (or
    `entries`, each with whether it is healthy, when auto-registration adds some), then connected pods
    of their own.

    A connected pod whose name is not registered but whose IP matches exactly one registered
    workload or entry is that workload (a VM whose agent names itself after its host), not a second one.
    """
    out = []
    index = WorkloadIndex(registry.workloads)
    for w in registry.workloads:
        pod = connected.get((w.namespace, w.name))
        # The injector labels a sidecar pod tlsMode=istio unless the pod says otherwise; a pod it did not
        # inject (`sidecar: none`) has no proxy to terminate mTLS, and the gateway template (`router`) sets none.
        implied = TLS_MODE_DISABLED if w.sidecar in ("none", "router") else TLS_MODE_ISTIO
        out.append(MeshWorkload(w.name, w.namespace, w.service_account, w.labels, w.ip or (pod.ip if pod else ""),
                                tls_mode=w.labels.get(TLS_MODE_LABEL, implied)))
    listed = entries if entries is not None else ((e, not e.health_checked) for e in registry.workload_entries)
    entry_workloads = [MeshWorkload.from_entry(entry, healthy) for entry, healthy in listed]
    out += entry_workloads
    entry_ips = {(w.namespace, w.ip) for w in entry_workloads if w.ip}
    for key in sorted(connected):
        pod = connected[key]
        if index.match(pod.namespace, pod.name, [pod.ip]) is None and (pod.namespace, pod.ip) not in entry_ips:
            out.append(MeshWorkload(pod.name, pod.namespace, pod.service_account, dict(pod.labels), pod.ip, False))
    return tuple(out)


def service_views(registry: Registry) -> tuple[ServiceView, ...]:
    views: dict[str, ServiceView] = {}
    for s in registry.services:
        host = s.hostname(registry.domain_suffix)
        views[host] = ServiceView(host, s.name, s.namespace, KUBERNETES, (s.cluster_ip,), s.ports, "EDS", service=s)
    for e in registry.service_entries:
        for host in e.hosts:
            if host in views:  # a Kubernetes service or an earlier entry already owns the name
                continue
            views[host] = ServiceView(host, "", e.namespace, EXTERNAL, e.addresses, e.ports, e.resolution, entry=e)
    return tuple(views[h] for h in sorted(views))


@dataclass
class MeshSnapshot:
    version: int
    registry: Registry
    workloads: tuple[MeshWorkload, ...]
    services: tuple[ServiceView, ...]
    memo: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_host = {s.hostname: s for s in self.services}
        self._endpoints: dict[tuple[str, int], tuple[Endpoint, ...]] = {}
        self._selected: dict[tuple[str, str], list[MeshWorkload]] = {}
        # (namespace, label, value) -> workloads, so a selector costs a few set lookups, not a scan of every pod.
        self._by_label: dict[tuple[str, str, str], list[int]] = {}
        for index, w in enumerate(self.workloads):
            for key, value in w.labels.items():
                self._by_label.setdefault((w.namespace, key, value), []).append(index)
        self._registered = WorkloadIndex(w for w in self.workloads if w.registered)
        self._unregistered = WorkloadIndex(w for w in self.workloads if not w.registered)

    @property
    def trust_domain(self) -> str:
        return self.registry.trust_domain

    def service(self, hostname: str) -> ServiceView | None:
        return self._by_host.get(hostname)

    def selected_workloads(self, service: Service) -> list[MeshWorkload]:
        """The pods a service selects (same namespace, every selector label matches), in registry order."""
        key = (service.namespace, service.name)
        if key not in self._selected:
            matched: set[int] | None = None
            for label, value in service.selector.items():
                found = set(self._by_label.get((service.namespace, label, value), ()))
                matched = found if matched is None else matched & found
                if not matched:
                    break
            self._selected[key] = [self.workloads[i] for i in sorted(matched or ())]
        return self._selected[key]

    def endpoints(self, view: ServiceView, port: ServicePort) -> tuple[Endpoint, ...]:
        """Endpoints of one service port (pods with an address; static service-entry endpoints)."""
        key = (view.hostname, port.port)
        if key not in self._endpoints:
            if view.service is not None:
                eps = [Endpoint(w.ip, port.target_port, w) for w in self.selected_workloads(view.service)
                       if w.ip and w.healthy]
            elif view.entry is not None and view.resolution == "STATIC":
                eps = [Endpoint(address, port.target_port) for address in view.entry.endpoints]
            else:
                eps = []
            # Workloads sharing an address (hostNetwork) and a target port are one endpoint: the first one's.
            unique: dict[tuple[str, int], Endpoint] = {}
            for endpoint in eps:
                unique.setdefault((endpoint.address, endpoint.port), endpoint)
            self._endpoints[key] = tuple(sorted(unique.values(), key=lambda e: (e.address, e.port)))
        return self._endpoints[key]

    def service_accounts(self, view: ServiceView) -> list[str]:
        """SPIFFE ids of the pods behind a service, for the client's SAN check."""
        if view.service is None:
            return []
        accounts = {self.registry.spiffe_id(w.namespace, w.service_account)
                    for w in self.selected_workloads(view.service)}
        return sorted(accounts)

    def workload_for(self, proxy: Proxy) -> MeshWorkload | None:
        """The proxy's own workload: registered by its pod name, else by its IP when that is unambiguous,
        else the pod as it described itself on connecting (None for a proxy the snapshot has not seen)."""
        registered = self._registered.match(proxy.namespace, proxy.pod_name, proxy.ips)
        return registered or self._unregistered.by_name(proxy.namespace, proxy.pod_name)

    def inbound_targets(self, workload: MeshWorkload | None) -> list[InboundTarget]:
        """Service ports the workload serves, one per target port (first service by hostname wins)."""
        if workload is None:
            return []
        out: dict[int, InboundTarget] = {}
        for view in self.services:
            if view.service is None or view.namespace != workload.namespace:
                continue
            if not view.service.selects(workload.labels):
                continue
            for port in view.ports:
                out.setdefault(port.target_port, InboundTarget(view, port))
        return [out[p] for p in sorted(out)]


def build_snapshot(version: int, registry: Registry,
                   connected: Mapping[tuple[str, str], ConnectedPod] | None = None) -> MeshSnapshot:
    return MeshSnapshot(version, registry, effective_workloads(registry, connected or {}), service_views(registry))

