"""`up --check` for ingress gateways: a Gateway and its VirtualServices, probed from the host (pure).

A Gateway selects gateway deployments by their labels; each of its HTTP
servers listens on a port of the gateway pod (the server's port, or the
targetPort of a service selecting the gateway that has that port, as istiod
translates it), and a deployment's `hostPorts` lead there from the host's
loopback. For each HTTP route of each VirtualService bound to the Gateway,
the check calls, from the host, `http://<host name>:<host port><path>`
with the host name resolving to 127.0.0.1 (a mount namespace of the probe
with its own /etc/hosts), so what is checked is what a user's browser or
curl on this machine would do. Expected: the route's destinations answer
(the whole chain behind them: the app calls its next hops), or the status
of a fault, a 403 when the destination's AuthorizationPolicy does not allow
the gateway's identity, a 502 when a next hop fails.

HTTPS, TLS and TCP servers, and VirtualServices whose hosts match no
server, are noted as not checked.
"""

from __future__ import annotations

from collections.abc import Sequence

from istiod_local.mesh import istiopolicy, istioroutes, traffic
from istiod_local.mesh.configcheck import ConfigProbe, Derived, Want, pods_of
from istiod_local.mesh.istioroutes import RequestShape
from istiod_local.mesh.model import Deployment, IstioResource, Mesh
from istiod_local.mesh.planner import MeshPlan

GATEWAY_REQUESTS = 5
DEFAULT_NAME = "ingress.example.com"  # what a wildcard-only host is called


def container_port(mesh: Mesh, gateway: Deployment, number: int) -> int:
    """The pod port a Gateway server's port means: a selecting service's targetPort for it, else itself."""
    for service in mesh.services:
        if service.selects(gateway.namespace, gateway.labels):
            for port in service.ports:
                if port.port == number:
                    return port.target_port
    return number


def _host_matches(pattern: str, name: str) -> bool:
    if pattern == "*":
        return True
    if pattern.startswith("*."):
        return name.endswith(pattern[1:])
    return pattern == name


def host_name(vs_hosts: Sequence[str], server_hosts: Sequence[str]) -> str | None:
    """A concrete name both the VirtualService and the server take."""
    candidates = [h for h in vs_hosts if "*" not in h]
    candidates += [h for h in server_hosts if "*" not in h]
    candidates += ["www" + h[1:] for h in (*vs_hosts, *server_hosts) if h.startswith("*.")] + [DEFAULT_NAME]
    for name in candidates:
        if any(_host_matches(v, name) for v in vs_hosts) and any(_host_matches(s, name) for s in server_hosts):
            return name
    return None


def _selected(plan: MeshPlan, gateway: IstioResource) -> list[Deployment]:
    selector = gateway.spec.get("selector") or {}
    return [d for d in plan.mesh.deployments if d.mode == "gateway" and selector and plan.first_pod(d) is not None
            and all(d.labels.get(k) == v for k, v in selector.items())]


def gateway_probes(plan: MeshPlan, derived: Derived) -> None:
    mesh = plan.mesh
    for gateway in mesh.resources("Gateway"):
        deployments = _selected(plan, gateway)
        if not deployments:
            derived.notes.append(f"{gateway.key} ({gateway.source}): selects no gateway deployment: not checked")
            continue
        bound = [vs for vs in mesh.resources("VirtualService")
                 if f"{gateway.namespace}/{gateway.name}" in istioroutes.gateways_of(vs)]
        for server in gateway.spec.get("servers") or []:
            port = server.get("port") or {}
            number, protocol = int(port.get("number", 0) or 0), str(port.get("protocol", "")).upper()
            if protocol != "HTTP":
                derived.notes.append(f"{gateway.key}: its {protocol} server on port {number}: applied, not checked")
                continue
            gw = deployments[0]
            pod_port = container_port(mesh, gw, number)
            host_port = next((h.host_port for h in gw.host_ports if h.container_port == pod_port), None)
            if host_port is None:
                derived.notes.append(f"{gateway.key}: port {number} (pod port {pod_port}) is no host port of "
                                     f"{gw.name}: not checked")
                continue
            server_hosts = [str(h).split("/", 1)[-1] for h in server.get("hosts") or []]
            for vs in bound:
                _virtual_service(plan, gateway, gw, vs, number, host_port, server_hosts, derived)


def _virtual_service(plan: MeshPlan, gateway: IstioResource, gw: Deployment, vs: IstioResource, number: int,
                     host_port: int, server_hosts: list[str], derived: Derived) -> None:
    name = host_name([str(h) for h in vs.spec.get("hosts") or []], server_hosts)
    if name is None:
        derived.notes.append(f"{vs.key}: no host of it is served by {gateway.key}: not checked")
        return
    routes = istioroutes.http_routes(vs)
    for route in routes:
        source = f"{gateway.key} {route.label}"
        shape = istioroutes.request_for(route.matches[0] if route.matches else None)
        if shape is None or istioroutes.first_route(routes, shape, number, gw.namespace, gw.labels) != route:
            derived.notes.append(f"{source}: no request the check can make takes it")
            continue
        want = _want(plan, gw, route, shape)
        if isinstance(want, str):
            derived.notes.append(f"{source}: {want}")
            continue
        derived.probes.append(ConfigProbe(
            source, "host", "", f"http://{name}:{host_port}{shape.path}", f"{name}:{host_port}",
            f"{shape.show()} x{GATEWAY_REQUESTS} from the host", shape.method, tuple(sorted(shape.headers.items())),
            GATEWAY_REQUESTS, want, hosts=(name,)))


def _want(plan: MeshPlan, gw: Deployment, route: istioroutes.HttpRoute, shape: RequestShape) -> Want | str:
    mesh = plan.mesh
    if route.abort_status and route.abort_percent >= 100:
        return Want(f"HTTP {route.abort_status} (fault abort)", route.abort_status)
    if route.abort_status or route.delay_s or route.unchecked:
        return "a fault, or fields the check does not evaluate"
    if not route.destinations:
        return "it routes nowhere (redirect or direct response)"
    backends = []
    statuses = set()
    for dest in route.destinations:
        servers = traffic.subset_deployments(plan, gw.namespace, dest.host, dest.subset)
        if isinstance(servers, traffic.Problem):
            return servers.reason
        service = next((s for s in mesh.services if s.hostname() == dest.host), None)
        if service is None or not servers:
            return f"{dest.host} has no pods"
        mtls = traffic.mtls_to(mesh, gw, service, servers)
        if isinstance(mtls, traffic.Problem):
            return mtls.reason
        port = dest.port or service.ports[0].port
        principal = istiopolicy.principal_of(gw.namespace, gw.service_account) if mtls else ""
        decision = traffic.authorize_all(mesh, servers, traffic.server_request(shape, service, port, principal,
                                                                                 dest.host))
        if decision.allowed is None:
            return decision.reason
        for server in servers:
            chain = traffic.chain_ok(plan, server, shape.headers) if decision.allowed else True
            if isinstance(chain, traffic.Problem):
                return chain.reason
            statuses.add(200 if chain and decision.allowed else 403 if not decision.allowed else 502)
        label = dest.host.split(".")[0] + (f" {dest.subset}" if dest.subset else "")
        total = sum(d.weight for d in route.destinations) or 1
        backends.append((label, pods_of(plan, servers), dest.weight / total))
    if len(statuses) != 1:
        return "its destinations answer differently"
    status = statuses.pop()
    if status != 200:
        return Want(f"HTTP {status}" + (" (RBAC)" if status == 403 else " (a next hop fails)"), status)
    shown = ", ".join(label for label, _, _ in backends)
    # Over a few requests, weighted destinations are checked for membership only.
    every = frozenset().union(*(pods for _, pods, _ in backends))
    return Want(f"{shown} answer", backends=((shown, every, 1.0),))
