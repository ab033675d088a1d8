"""The mesh file as data: frozen dataclasses the parser returns and the planner reads (no I/O).

See `istiod_local.mesh.parser` for the file's schema and `docs/MESH.md` for a
user's guide. A `Target` is a resolved `calls`/`next` entry: which service
(or service entry) and port a client means, so the planner and the check
need not resolve names again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from istiod_local.node.upstream import AGENT_IMPLEMENTATIONS

MTLS_MODES = ("STRICT", "PERMISSIVE", "DISABLE")
PROTOCOLS = ("HTTP", "HTTP2", "GRPC", "TCP")
# gateway: our agent as `pilot-agent proxy router` with the real Envoy, no capture (an ingress gateway's pod).
MODES = ("sidecar", "proxyless", "none", "gateway")
# Whose pilot-agent a meshed deployment's pods run: ours (the default), or upstream's Go one.
AGENTS = AGENT_IMPLEMENTATIONS
APP_KINDS = ("http-echo", "tcp-echo", "grpc-server", "grpc-client", "client", "none")
# The app kinds that listen (need a port) and those that call others in the background.
SERVER_KINDS = ("http-echo", "tcp-echo", "grpc-server")
CLIENT_KINDS = ("client", "grpc-client")
RESOLUTIONS = ("STATIC", "DNS", "NONE")
DEFAULT_NAMESPACE = "default"
DEFAULT_CALL_INTERVAL = 1.0
GRPC_CONTROL_PORT = 8081  # a grpc-client's local control port (the check drives its probes through it)


@dataclass(frozen=True)
class Namespace:
    name: str
    peer_authentication: str = "PERMISSIVE"
    labels: Mapping[str, str] = field(default_factory=dict)
    mode_given: bool = False  # the file set `peerAuthentication` (else a mesh-wide PeerAuthentication may decide)


@dataclass(frozen=True)
class Port:
    name: str
    port: int
    target_port: int
    protocol: str


@dataclass(frozen=True)
class Service:
    name: str
    namespace: str
    selector: Mapping[str, str]
    ports: tuple[Port, ...]
    cluster_ip: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def hostname(self) -> str:
        return f"{self.name}.{self.namespace}.svc.cluster.local"

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Kubernetes semantics: same namespace, every selector label matches; an empty selector selects nothing."""
        return (namespace == self.namespace and bool(self.selector)
                and all(labels.get(k) == v for k, v in self.selector.items()))


@dataclass(frozen=True)
class Target:
    """A resolved call: a service's port, or a service entry's (`entry=True`, `host` is its name)."""

    host: str  # the FQDN a client with DNS capture uses
    port: int
    protocol: str
    service: str = ""  # "<namespace>/<name>" of a service; "" for a service entry
    entry: str = ""  # the service entry's name for an entry target

    @property
    def is_entry(self) -> bool:
        return bool(self.entry)

    @property
    def label(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class App:
    kind: str = "none"
    port: int = 0
    next: tuple[Target, ...] = ()  # http-echo: every request it serves calls these first (a chain)
    calls: tuple[Target, ...] = ()  # client, grpc-client: called every `interval` seconds
    interval: float = DEFAULT_CALL_INTERVAL


@dataclass(frozen=True)
class HostPort:
    """A port on the host's loopback that leads to a container port of the deployment's first pod."""

    host_port: int
    container_port: int


@dataclass(frozen=True)
class Deployment:
    name: str
    namespace: str
    replicas: int
    service_account: str
    labels: Mapping[str, str]
    mode: str
    app: App
    dns_capture: bool = False
    agent: str = "istio-agent"
    host_ports: tuple[HostPort, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class EntryEndpoint:
    address: str = ""
    deployment: str = ""  # "<namespace>/<name>": every pod of that deployment


@dataclass(frozen=True)
class ServiceEntry:
    name: str
    namespace: str
    hosts: tuple[str, ...]
    addresses: tuple[str, ...]
    ports: tuple[Port, ...]
    resolution: str
    endpoints: tuple[EntryEndpoint, ...] = ()


@dataclass(frozen=True)
class IstioResource:
    """One Istio resource of the files the mesh file names (`istioConfig:`), as written.

    `document` is the whole object (apiVersion, kind, metadata with the namespace filled in, spec): what the
    real istiod is given. `source` says where it was read (`file:line`), for every message about it.
    """

    kind: str
    api_version: str
    namespace: str
    name: str
    document: Mapping[str, Any] = field(hash=False)
    source: str = field(default="", compare=False)

    @property
    def key(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"

    @property
    def spec(self) -> Mapping[str, Any]:
        spec = self.document.get("spec")
        return spec if isinstance(spec, Mapping) else {}


# denied: an HTTP 403 from the server's RBAC filter (an AuthorizationPolicy), the connection itself was made.
OUTCOMES = ("mtls", "plaintext", "refused", "denied")


@dataclass(frozen=True)
class Expectation:
    """A declared outcome for the check, replacing what the policies say for the calls it matches, and the
    response headers its HTTP answers must carry (what a WasmPlugin adds: the check cannot derive it)."""

    client: str  # "<namespace>/<deployment>"
    service: str = ""  # "<namespace>/<service>", or
    entry: str = ""  # a service entry's name
    port: int = 0  # a service port; 0: every port
    outcome: str = "mtls"  # "": not declared (only with headers): the policies say
    headers: tuple[tuple[str, str], ...] = ()  # (lowercase name, value) each answer carries


@dataclass(frozen=True)
class Mesh:
    namespaces: tuple[Namespace, ...]
    services: tuple[Service, ...] = ()
    deployments: tuple[Deployment, ...] = ()
    service_entries: tuple[ServiceEntry, ...] = ()
    expectations: tuple[Expectation, ...] = ()
    istio_config_paths: tuple[str, ...] = ()  # `istioConfig:` as written (relative to the mesh file)
    istio_config: tuple[IstioResource, ...] = ()  # what those files hold (read by `mesh.istiofiles`)
    wasm_modules: tuple[str, ...] = ()  # `wasmModules:` as written: files `up` serves the pods (`mesh.wasmfiles`)

    def namespace(self, name: str) -> Namespace:
        return next((n for n in self.namespaces if n.name == name), Namespace(name))

    def mtls_mode(self, namespace: str) -> str:
        """The file's own PeerAuthentication mode of a namespace (Istio config may say more: `istiopolicy`)."""
        return self.namespace(namespace).peer_authentication

    def resources(self, *kinds: str) -> list[IstioResource]:
        """The Istio resources of these kinds, in file order."""
        return [r for r in self.istio_config if r.kind in kinds]

    def service(self, key: str) -> Service | None:
        return next((s for s in self.services if s.key == key), None)

    def entry(self, name: str) -> ServiceEntry | None:
        return next((e for e in self.service_entries if e.name == name), None)

    def deployment(self, key: str) -> Deployment | None:
        return next((d for d in self.deployments if d.key == key), None)

    def backends(self, service: Service) -> list[Deployment]:
        """The deployments whose pods the service selects."""
        return [d for d in self.deployments if service.selects(d.namespace, d.labels)]

    def spiffe_id(self, deployment: Deployment) -> str:
        return f"spiffe://cluster.local/ns/{deployment.namespace}/sa/{deployment.service_account}"
