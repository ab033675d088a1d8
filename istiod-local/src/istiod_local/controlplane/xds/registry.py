"""The service registry: a tiny Kubernetes (services, workloads, PeerAuthentication, ServiceEntries).

istiod-local has no API server; the mesh is described by one YAML file:

    trustDomain: cluster.local            # optional
    services:
    - name: echo
      namespace: default
      selector: {app: echo}
      ports: [{name: http, port: 80, targetPort: 8080, protocol: HTTP}]
      clusterIP: 10.96.0.20               # optional, else allocated from 10.96.0.0/16
    workloads:
    - {name: echo-1, namespace: default, serviceAccount: echo, labels: {app: echo}, ip: 10.244.0.5}
      # optional, for the Pod istiod-local's Kubernetes API shows (controlplane/kubeapi):
      # nodeName: node-1               # spec.nodeName (else the API's default node)
      # annotations: {k: v}            # merged over the injector's annotations
      # sidecar: envoy                 # envoy | proxyless (grpc-agent template) | router (gateway) | none
      # captureInit: cni               # cni (istio-validation) | init (istio-init)
      # pod: {spec: ...}               # a partial Pod deep-merged last (containers/env lists by name)
    namespaces:                           # optional: labels of Kubernetes namespaces
      default: {labels: {istio-injection: enabled}}
    peerAuthentication: {default: PERMISSIVE}   # namespace -> PERMISSIVE | STRICT | DISABLE
    serviceEntries:
    - hosts: [api.example.com]
      addresses: [192.0.2.10]             # optional
      ports: [{number: 443, name: tls, protocol: TCP}]
      resolution: DNS                     # NONE | STATIC | DNS | DNS_ROUND_ROBIN
    workloadGroups: [...]                 # VMs: see `workloadgroups.py` (template, probe)
    workloadEntries: [...]                # non-pod endpoints, selected by services like pods
    wasmPlugins: [...]                    # Wasm extensions (ECDS): see `wasmplugins.py`
    wasmPullSecrets: [...]

Workloads are unique by namespace and name, not by address: several may
share an IP, as hostNetwork pods or the workloads of one VM do in a cluster
(a proxy is matched to its workload by name; see `mesh.match_workload`).

`parse_registry` is pure: text in, a frozen `Registry` out, or a
`RegistryError` naming the line and field. Nothing here knows about files or
Envoy.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from yaml.constructor import SafeConstructor

from istio_agent.config.textfile import non_utf8_problem
from istiod_local.controlplane.xds.allocation import allocate_auto_vips, allocate_cluster_ips
from istiod_local.controlplane.xds.wasmplugins import (
    PullSecret,
    WasmPlugin,
    parse_pull_secrets,
    parse_wasm_plugins,
)
from istiod_local.controlplane.xds.workloadgroups import (
    WorkloadEntry,
    WorkloadGroup,
    parse_workload_entries,
    parse_workload_groups,
)
from istiod_local.controlplane.xds.yamlfields import (
    DNS_LABEL,
    Fields,
    RegistryError,
    choice,
    compose,
    dns_label,
    ip_address,
    line_of,
    namespaced_items,
    protocol_from_name,
)

PROTOCOLS = ("HTTP", "HTTP2", "GRPC", "TCP")
HTTP_PROTOCOLS = frozenset({"HTTP", "HTTP2", "GRPC"})
MTLS_MODES = ("PERMISSIVE", "STRICT", "DISABLE")
RESOLUTIONS = ("NONE", "STATIC", "DNS", "DNS_ROUND_ROBIN")
INBOUND_POLICIES = ("PASSTHROUGH", "LOCALHOST")
DEFAULT_TRUST_DOMAIN = "cluster.local"
DEFAULT_DOMAIN_SUFFIX = "cluster.local"
# PeerAuthentication in the root namespace applies mesh-wide, as upstream's istio-system does.
ROOT_NAMESPACE = "istio-system"

_DNS_NAME = re.compile(r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class ServicePort:
    name: str
    port: int
    target_port: int
    protocol: str

    @property
    def is_http(self) -> bool:
        return self.protocol in HTTP_PROTOCOLS

    @property
    def is_http2(self) -> bool:
        return self.protocol in ("HTTP2", "GRPC")


@dataclass(frozen=True)
class Service:
    name: str
    namespace: str
    selector: Mapping[str, str]
    ports: tuple[ServicePort, ...]
    cluster_ip: str
    cluster_ip_allocated: bool = False

    def hostname(self, domain_suffix: str = DEFAULT_DOMAIN_SUFFIX) -> str:
        return f"{self.name}.{self.namespace}.svc.{domain_suffix}"

    def selects(self, labels: Mapping[str, str]) -> bool:
        """Kubernetes semantics: an empty selector selects nothing."""
        return bool(self.selector) and all(labels.get(k) == v for k, v in self.selector.items())


SIDECAR_KINDS = ("envoy", "proxyless", "router", "none")
CAPTURE_INITS = ("cni", "init")


@dataclass(frozen=True)
class Workload:
    name: str
    namespace: str
    service_account: str
    labels: Mapping[str, str]
    ip: str = ""
    # What the Kubernetes API (controlplane/kubeapi) renders for it; the xDS side ignores these.
    node_name: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)
    sidecar: str = "envoy"
    capture_init: str = "cni"
    pod: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ServiceEntry:
    namespace: str
    hosts: tuple[str, ...]
    addresses: tuple[str, ...]
    ports: tuple[ServicePort, ...]
    resolution: str
    endpoints: tuple[str, ...] = ()
    name: str = ""


@dataclass(frozen=True)
class Registry:
    trust_domain: str = DEFAULT_TRUST_DOMAIN
    domain_suffix: str = DEFAULT_DOMAIN_SUFFIX
    services: tuple[Service, ...] = ()
    workloads: tuple[Workload, ...] = ()
    peer_authentication: Mapping[str, str] = field(default_factory=dict)
    service_entries: tuple[ServiceEntry, ...] = ()
    inbound_traffic_policy: str = "PASSTHROUGH"
    # Stable VIPs for service-entry hosts without addresses (given only to proxies that ask).
    auto_vips: Mapping[str, str] = field(default_factory=dict)
    # Namespace name -> its labels, for the Kubernetes API's Namespace objects.
    namespaces: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    workload_groups: tuple[WorkloadGroup, ...] = ()
    workload_entries: tuple[WorkloadEntry, ...] = ()
    wasm_plugins: tuple[WasmPlugin, ...] = ()  # see `wasmplugins.py`
    wasm_pull_secrets: tuple[PullSecret, ...] = ()

    def workload_group(self, namespace: str, name: str) -> WorkloadGroup | None:
        return next((g for g in self.workload_groups if g.namespace == namespace and g.name == name), None)

    def workload_entry(self, namespace: str, name: str) -> WorkloadEntry | None:
        return next((e for e in self.workload_entries if e.namespace == namespace and e.name == name), None)

    def mtls_mode(self, namespace: str) -> str:
        return self.peer_authentication.get(namespace) or self.peer_authentication.get(ROOT_NAMESPACE) or "PERMISSIVE"

    def spiffe_id(self, namespace: str, service_account: str) -> str:
        return f"spiffe://{self.trust_domain}/ns/{namespace}/sa/{service_account}"


_TOP = frozenset({"trustDomain", "domainSuffix", "services", "workloads", "peerAuthentication", "serviceEntries",
                  "inboundTrafficPolicy", "namespaces", "workloadGroups", "workloadEntries", "wasmPlugins",
                  "wasmPullSecrets"})
_SERVICE = frozenset({"name", "namespace", "selector", "ports", "clusterIP"})
_PORT = frozenset({"name", "targetPort", "protocol"})
_WORKLOAD = frozenset({"name", "namespace", "serviceAccount", "labels", "ip", "nodeName", "annotations", "sidecar",
                       "captureInit", "pod"})
_NAMESPACE = frozenset({"labels"})
_POD = frozenset({"metadata", "spec", "status"})
_ENTRY = frozenset({"name", "namespace", "hosts", "addresses", "ports", "resolution", "endpoints"})
_ENDPOINT = frozenset({"address"})










def _port(path: str, node: object, source: str, number_key: str) -> tuple[ServicePort, Fields]:
    f = Fields(node, path, source, _PORT | {number_key})  # type: ignore[arg-type]
    port = f.integer(number_key, low=1, high=65535)
    name = f.string("name", "")
    protocol = choice(f, "protocol", PROTOCOLS) if f.has("protocol") else protocol_from_name(name)
    target = f.integer("targetPort", default=port, low=1, high=65535)
    return ServicePort(name, port, target, protocol), f


def _ports(f: Fields, number_key: str) -> tuple[ServicePort, ...]:
    ports: list[ServicePort] = []
    seen: dict[int, str] = {}
    for path, node in f.items("ports", required=True):
        port, pf = _port(path, node, f.source, number_key)
        if port.port in seen:
            pf.fail(pf.value_node(number_key), number_key, f"port {port.port} is already declared at {seen[port.port]}")
        seen[port.port] = path
        ports.append(port)
    return tuple(ports)


def _services(top: Fields) -> list[tuple[Service, Fields]]:
    out: list[tuple[Service, Fields]] = []
    for f, name, namespace in namespaced_items(top, "services", _SERVICE, "service"):
        cluster_ip = ip_address(f, "clusterIP")
        out.append((Service(name, namespace, f.string_map("selector"), _ports(f, "port"), cluster_ip), f))
    return out


def _workloads(top: Fields) -> tuple[Workload, ...]:
    out: list[Workload] = []
    for f, name, namespace in namespaced_items(top, "workloads", _WORKLOAD, "workload"):
        ip = ip_address(f, "ip")  # may repeat: hostNetwork pods and workloads on one VM share their host's address
        account = dns_label(f, "serviceAccount", "default")
        node_name = f.string("nodeName", "")
        if node_name and not _DNS_NAME.match(node_name):
            f.fail(f.value_node("nodeName"), "nodeName", f"must be a DNS name, got {node_name!r}")
        out.append(Workload(name, namespace, account, f.string_map("labels"), ip, node_name,
                            f.string_map("annotations"), choice(f, "sidecar", SIDECAR_KINDS, "envoy"),
                            choice(f, "captureInit", CAPTURE_INITS, "cni"), _pod(f)))
    return tuple(out)


def _pod(f: Fields) -> dict[str, Any]:
    """The `pod` overlay as plain data (a partial Pod: metadata, spec, status), checked only for its shape."""
    if not f.has("pod"):
        return {}
    Fields(f.value_node("pod"), f.child_path("pod"), f.source, _POD)  # a mapping of known top-level keys
    value = SafeConstructor().construct_object(f.value_node("pod"), deep=True)
    for key in ("metadata", "spec", "status"):
        if key in value and not isinstance(value[key], dict):
            raise RegistryError(f.source, line_of(f.value_node("pod")), f"{f.child_path('pod')}.{key}",
                                "must be a mapping")
    return dict(value)


def _namespaces(top: Fields) -> dict[str, dict[str, str]]:
    if not top.has("namespaces"):
        return {}
    f = Fields(top.value_node("namespaces"), "namespaces", top.source)
    out = {}
    for namespace in f.names():
        if not DNS_LABEL.match(namespace):
            f.fail(f.value_node(namespace), namespace, "namespace must be a DNS label")
        inner = Fields(f.value_node(namespace), f.child_path(namespace), top.source, _NAMESPACE) \
            if f.has(namespace) else None
        out[namespace] = inner.string_map("labels") if inner is not None else {}
    return out


def _peer_authentication(top: Fields) -> dict[str, str]:
    if not top.has("peerAuthentication"):
        return {}
    f = Fields(top.value_node("peerAuthentication"), "peerAuthentication", top.source)
    out = {}
    for namespace in f.names():
        if not DNS_LABEL.match(namespace):
            f.fail(f.value_node(namespace), namespace, "namespace must be a DNS label")
        out[namespace] = choice(f, namespace, MTLS_MODES)
    return out


def _service_entries(top: Fields) -> tuple[ServiceEntry, ...]:
    out: list[ServiceEntry] = []
    for path, node in top.items("serviceEntries"):
        f = Fields(node, path, top.source, _ENTRY)
        hosts = []
        for host_path, host_node, host in f.string_list("hosts", required=True):
            if not _DNS_NAME.match(host.lower()):
                raise RegistryError(top.source, line_of(host_node), host_path, f"not a DNS name: {host!r}")
            hosts.append(host.lower())
        addresses = []
        for address_path, address_node, address in f.string_list("addresses"):
            try:
                addresses.append(str(ipaddress.ip_address(address)))
            except ValueError:
                raise RegistryError(top.source, line_of(address_node), address_path,
                                    f"must be an IP address, got {address!r}") from None
        resolution = choice(f, "resolution", RESOLUTIONS, "NONE")
        endpoints = []
        for endpoint_path, endpoint_node in f.items("endpoints"):
            ef = Fields(endpoint_node, endpoint_path, top.source, _ENDPOINT)
            endpoints.append(ef.string("address"))
        if resolution == "STATIC" and not endpoints:
            f.fail(f.value_node("resolution"), "resolution", "STATIC needs endpoints")
        namespace = dns_label(f, "namespace", "default")
        out.append(ServiceEntry(namespace, tuple(hosts), tuple(addresses), _ports(f, "number"), resolution,
                                tuple(endpoints), f.string("name", "")))
    return tuple(out)


def _assign_cluster_ips(services: list[tuple[Service, Fields]]) -> tuple[Service, ...]:
    taken: dict[str, str] = {}
    for service, f in services:
        if service.cluster_ip:
            if service.cluster_ip in taken:
                f.fail(f.value_node("clusterIP"), "clusterIP",
                       f"{service.cluster_ip} is already used by {taken[service.cluster_ip]}")
            taken[service.cluster_ip] = f.path
    wanted = [f"{s.namespace}/{s.name}" for s, _ in services if not s.cluster_ip]
    try:
        allocated = allocate_cluster_ips(wanted, taken)
    except ValueError as exc:
        raise RegistryError(services[0][1].source, 0, "services", str(exc)) from None
    out = []
    for service, _ in services:
        if service.cluster_ip:
            out.append(service)
        else:
            ip = allocated[f"{service.namespace}/{service.name}"]
            out.append(Service(service.name, service.namespace, service.selector, service.ports, ip, True))
    return tuple(out)


def _auto_vips(entries: tuple[ServiceEntry, ...]) -> dict[str, str]:
    """VIPs for service-entry hosts without addresses: not NONE resolution, not wildcards (as upstream)."""
    keys = {f"{e.namespace}/{h}": h for e in entries if not e.addresses and e.resolution != "NONE"
            for h in e.hosts if not h.startswith("*")}
    allocated = allocate_auto_vips(keys)
    return {keys[k]: ip for k, ip in allocated.items()}


def decode_registry(data: bytes, source: str) -> str:
    """The file's text; RegistryError naming the file, line and byte when it is not UTF-8."""
    problem = non_utf8_problem(data)
    if problem is not None:
        raise RegistryError(source, problem[0], "", problem[1])
    return data.decode("utf-8")


def parse_registry(text: str, source: str = "registry") -> Registry:
    """Parse and validate a registry document; `RegistryError` names the line and field of the first problem.

    A document with nothing in it (an empty file, the state an editor or `>` leaves
    mid-write) is refused: an empty mesh is written `{}`.
    """
    root = compose(text, source)
    if root is None:
        raise RegistryError(source, 0, "", "the registry is empty (no document); write {} for an empty mesh")
    top = Fields(root, "", source, _TOP)
    trust_domain = top.string("trustDomain", DEFAULT_TRUST_DOMAIN)
    if not _DNS_NAME.match(trust_domain):
        top.fail(top.value_node("trustDomain"), "trustDomain", f"not a valid trust domain: {trust_domain!r}")
    domain_suffix = top.string("domainSuffix", DEFAULT_DOMAIN_SUFFIX)
    if not _DNS_NAME.match(domain_suffix):
        top.fail(top.value_node("domainSuffix"), "domainSuffix", f"not a DNS name: {domain_suffix!r}")
    services = _assign_cluster_ips(_services(top))
    entries = _service_entries(top)
    return Registry(
        trust_domain=trust_domain,
        domain_suffix=domain_suffix,
        services=services,
        workloads=_workloads(top),
        peer_authentication=_peer_authentication(top),
        service_entries=entries,
        inbound_traffic_policy=choice(top, "inboundTrafficPolicy", INBOUND_POLICIES, "PASSTHROUGH"),
        auto_vips=_auto_vips(entries),
        namespaces=_namespaces(top),
        workload_groups=parse_workload_groups(top),
        workload_entries=parse_workload_entries(top),
        wasm_plugins=parse_wasm_plugins(top),
        wasm_pull_secrets=parse_pull_secrets(top),
    )
