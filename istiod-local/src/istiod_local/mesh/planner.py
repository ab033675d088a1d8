"""From a `Mesh` to what the local node runs: pod specs, app command lines and istiod-local's registry (pure).

Pods are named `<deployment>-<n>` (n from 1), so a replica count change adds
or removes the highest numbers and leaves the others running. Every service
gets its clusterIP here (the file's, or istiod-local's own allocation), so
app command lines can name it for pods without DNS capture; pods with DNS
capture call by name (`<service>.<namespace>.svc.cluster.local`), which
their agent's DNS proxy answers from istiod-local's NameTable.

Capacity is checked before anything is planned (`check_capacity`): a node
holds at most `MAX_PODS` pods (each a network namespace with an agent and
an Envoy), so 10,000 deployments of 100 replicas, or `--scale 100000`, is
refused in microseconds with the limit named instead of planning a million
pods.

`registry_document` is the registry istiod-local serves
(`controlplane/xds/registry.py`): the services, one workload per planned
pod (`node.plan.registry_workloads`), the namespaces with their labels, the
PeerAuthentication mode per namespace (the file's, or its Istio config's
namespace-wide or mesh-wide PeerAuthentication: `istiopolicy.namespace_mode`),
the service entries with their endpoints (a `deployment:` endpoint
becomes the addresses of its pods), and the Istio config's WasmPlugins as
`wasmPlugins` (`mesh.wasmplugins`). A gateway deployment's pods run
`pilot-agent proxy router`; its first pod takes its host ports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from istiod_local.controlplane.xds.allocation import allocate_cluster_ips
from istiod_local.mesh.istiopolicy import namespace_mode
from istiod_local.mesh.model import GRPC_CONTROL_PORT, Deployment, Mesh, Target
from istiod_local.mesh.wasmplugins import KIND as WASM_PLUGIN
from istiod_local.mesh.wasmplugins import registry_entries
from istiod_local.node.plan import PlanError, PodPlan, PodSpec, registry_workloads

MAX_PODS = 4096  # a /20 pod CIDR's worth; far more than one machine runs
APPS_MODULE = "istiod_local.mesh.apps"
GRPC_APPS_MODULE = "istiod_local.node.grpc_apps"


@dataclass(frozen=True)
class MeshPlan:
    """What the node runs for one version of the mesh file."""

    mesh: Mesh
    scale: int
    cluster_ips: Mapping[str, str]  # "<namespace>/<service>" -> clusterIP
    pods: tuple[PodSpec, ...]
    deployment_of: Mapping[str, str] = field(default_factory=dict)  # pod name -> "<namespace>/<deployment>"
    ready_ports: Mapping[str, int] = field(default_factory=dict)  # pod name -> the app port to wait for

    def pod(self, name: str) -> PodSpec | None:
        return next((p for p in self.pods if p.name == name), None)

    def first_pod(self, deployment: Deployment) -> str | None:
        """The deployment's first pod (the check's client), None when it has no replicas."""
        name = pod_name(deployment, 1)
        return name if name in self.deployment_of else None

    def pods_of(self, deployment_key: str) -> list[str]:
        return [name for name, key in self.deployment_of.items() if key == deployment_key]


def pod_name(deployment: Deployment, index: int) -> str:
    return f"{deployment.name}-{index}"


def cluster_ips(mesh: Mesh) -> dict[str, str]:
    """Each service's clusterIP: the file's, else the address istiod-local would allocate for it."""
    given = {s.key: s.cluster_ip for s in mesh.services if s.cluster_ip}
    allocated = allocate_cluster_ips([s.key for s in mesh.services if not s.cluster_ip], given.values())
    return {**given, **allocated}


def target_address(target: Target, caller: Deployment, mesh: Mesh, ips: Mapping[str, str]) -> str:
    """The host a caller uses: the name with DNS capture, else the clusterIP (or the entry's first address)."""
    if caller.dns_capture or caller.mode == "proxyless":
        return target.host
    if target.is_entry:
        entry = mesh.entry(target.entry)
        return entry.addresses[0] if entry is not None and entry.addresses else target.host
    return ips[target.service]


def call_url(target: Target, caller: Deployment, mesh: Mesh, ips: Mapping[str, str]) -> str:
    """What the app is given: `http://host:port/`, `tcp://host:port`, `grpc://host:port` or `xds:///host:port`."""
    if caller.mode == "proxyless":
        return f"xds:///{target.host}:{target.port}"
    host = target_address(target, caller, mesh, ips)
    scheme = {"HTTP": "http", "HTTP2": "http", "GRPC": "grpc", "TCP": "tcp"}[target.protocol]
    return f"{scheme}://{host}:{target.port}" + ("/" if scheme == "http" else "")


def app_argv(deployment: Deployment, mesh: Mesh, ips: Mapping[str, str], python: str, pod: str = "") -> list[str]:
    """The app container's command line (empty: no app)."""
    app = deployment.app
    ours = [python, "-m", APPS_MODULE, *(["--pod", pod] if pod else [])]
    if app.kind == "http-echo":
        argv = [*ours, "http-echo", "--port", str(app.port)]
        for target in app.next:
            argv += ["--next", call_url(target, deployment, mesh, ips)]
        return argv
    if app.kind == "tcp-echo":
        return [*ours, "tcp-echo", "--port", str(app.port)]
    if app.kind == "grpc-server":
        plain = [] if deployment.mode == "proxyless" else ["--plain"]  # behind a sidecar: Envoy does the mTLS
        return [python, "-m", GRPC_APPS_MODULE, "serve", "--port", str(app.port), *plain]
    if app.kind in ("client", "grpc-client"):
        argv = [*ours, app.kind, "--interval", f"{app.interval:g}"]
        if app.kind == "grpc-client":
            argv += ["--control-port", str(GRPC_CONTROL_PORT)]
        for target in app.calls:
            argv += ["--call", call_url(target, deployment, mesh, ips)]
        return argv
    return []


# Upstream's grpc-agent template leaves this label to the user ("must be set by user, if gRPC is using mTLS
# initialization code"); the demo gRPC apps use xDS credentials, so their proxyless pods carry it, as a user's
# would. istiod-local implies it anyway; a real istiod reads it from the Pod and, without it, would give a
# proxyless server a plaintext listener under PERMISSIVE while its clients speak mTLS.
TLS_MODE_LABEL = "security.istio.io/tlsMode"


def pod_labels(deployment: Deployment) -> dict[str, str]:
    labels = dict(deployment.labels)
    if deployment.mode == "proxyless" and deployment.app.kind in ("grpc-server", "grpc-client"):
        labels.setdefault(TLS_MODE_LABEL, "istio")
    return labels


def pod_spec(deployment: Deployment, index: int, mesh: Mesh, ips: Mapping[str, str], python: str) -> PodSpec:
    """A pod of the deployment; a gateway's first pod takes its host ports (the host has each port once)."""
    name = pod_name(deployment, index)
    host_ports = tuple((p.host_port, p.container_port) for p in deployment.host_ports) if index == 1 else ()
    return PodSpec(name, namespace=deployment.namespace,
                   service_account=deployment.service_account, labels=pod_labels(deployment),
                   app=tuple(app_argv(deployment, mesh, ips, python, name)), sidecar=deployment.mode != "none",
                   dns_capture=deployment.dns_capture, proxyless=deployment.mode == "proxyless",
                   agent_implementation=deployment.agent, router=deployment.mode == "gateway",
                   host_ports=host_ports)


class CapacityError(PlanError):
    """The mesh has more pods than a node holds."""


def pod_count(mesh: Mesh, scale: int = 1) -> int:
    """How many pods the mesh has at this scale (without planning them)."""
    return sum(d.replicas for d in mesh.deployments) * scale


def check_capacity(mesh: Mesh, scale: int = 1, max_pods: int = MAX_PODS) -> int:
    """The mesh's pod count; CapacityError naming the limit when it is over it."""
    if scale < 1:
        raise ValueError(f"scale must be at least 1, got {scale}")
    count = pod_count(mesh, scale)
    if count > max_pods:
        replicas = sum(d.replicas for d in mesh.deployments)
        raise CapacityError(f"the mesh has {count} pods ({replicas} replicas across {len(mesh.deployments)} "
                            f"deployments, times --scale {scale}); a local node holds at most {max_pods}")
    return count


def plan_mesh(mesh: Mesh, scale: int = 1, python: str = "python3", max_pods: int = MAX_PODS) -> MeshPlan:
    """Every pod of the mesh (`replicas * scale` per deployment), in file order."""
    check_capacity(mesh, scale, max_pods)
    ips = cluster_ips(mesh)
    pods: list[PodSpec] = []
    owners: dict[str, str] = {}
    ports: dict[str, int] = {}
    for deployment in mesh.deployments:
        for index in range(1, deployment.replicas * scale + 1):
            spec = pod_spec(deployment, index, mesh, ips, python)
            pods.append(spec)
            owners[spec.name] = deployment.key
            if deployment.app.port:
                ports[spec.name] = deployment.app.port
    return MeshPlan(mesh, scale, ips, tuple(pods), owners, ports)


def registry_document(plan: MeshPlan, pods: Sequence[PodPlan]) -> dict[str, Any]:
    """istiod-local's registry for the mesh with these placed pods (their addresses)."""
    mesh = plan.mesh
    addresses: dict[str, list[str]] = {}
    for pod in pods:
        owner = plan.deployment_of.get(pod.name)
        if owner:
            addresses.setdefault(owner, []).append(pod.ip)
    services = [{"name": s.name, "namespace": s.namespace, "selector": dict(s.selector),
                 "clusterIP": plan.cluster_ips[s.key],
                 "ports": [{"name": p.name or f"{p.protocol.lower()}-{p.port}", "port": p.port,
                            "targetPort": p.target_port, "protocol": p.protocol} for p in s.ports]}
                for s in mesh.services]
    entries = []
    for e in mesh.service_entries:
        endpoints: list[str] = []
        for endpoint in e.endpoints:
            endpoints += addresses.get(endpoint.deployment, []) if endpoint.deployment else [endpoint.address]
        entry: dict[str, Any] = {
            "name": e.name, "namespace": e.namespace, "hosts": list(e.hosts),
            "ports": [{"number": p.port, "name": p.name or f"{p.protocol.lower()}-{p.port}",
                       "targetPort": p.target_port, "protocol": p.protocol} for p in e.ports],
            "resolution": e.resolution if e.resolution != "STATIC" or endpoints else "NONE"}
        if e.addresses:
            entry["addresses"] = list(e.addresses)
        if e.resolution == "STATIC" and endpoints:
            entry["endpoints"] = [{"address": a} for a in endpoints]
        entries.append(entry)
    wasm = registry_entries(mesh.resources(WASM_PLUGIN))
    return {
        "services": services,
        "workloads": registry_workloads(pods),
        "namespaces": {n.name: {"labels": dict(n.labels)} for n in mesh.namespaces},
        # The file's modes, or what a namespace-wide or mesh-wide PeerAuthentication of its Istio config says.
        "peerAuthentication": {n.name: namespace_mode(mesh, n.name) for n in mesh.namespaces},
        "serviceEntries": entries,
        **({"wasmPlugins": wasm} if wasm else {}),
    }
