"""Where a request goes and whether it gets through, from the mesh file and its Istio config (pure).

The check's two kinds of expectations meet here: the pairwise probes
(`expect.py`: mTLS, plaintext, refused, denied) and the probes derived from
Istio config (`configcheck.py`: routes, faults, timeouts, authorization).
Both ask the same questions of a request from a client deployment to a
service: which VirtualService route takes it (`route_for`), which
deployments it can reach and with what share (`reached`), what the servers'
AuthorizationPolicies decide (`authorize_all`), and whether the server's
app answers 200 (`chain_ok`: an http-echo calls its next hops first, as
itself, and answers 502 when one of them fails).

Every answer may be "not derivable" (a `Problem` naming why); the check
then lists the case as not checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from istiod_local.mesh import istiopolicy, istioroutes
from istiod_local.mesh.istiopolicy import Decision, Request, principal_of
from istiod_local.mesh.istioroutes import HttpRoute, RequestShape
from istiod_local.mesh.model import Deployment, Mesh, Service, Target
from istiod_local.mesh.planner import MeshPlan

MAX_CHAIN = 6  # next hops followed (a longer chain, or a loop, is not derived)


@dataclass(frozen=True)
class Problem:
    """Why something is not derived."""

    reason: str


@dataclass(frozen=True)
class RouteChoice:
    route: HttpRoute | None  # None: no VirtualService route takes it (istiod's default route)


def live(plan: MeshPlan, deployments: list[Deployment]) -> list[Deployment]:
    return [d for d in deployments if plan.first_pod(d) is not None]


def is_gateway_service(mesh: Mesh, service: Service) -> bool:
    return any(d.mode == "gateway" for d in mesh.backends(service))


def route_for(mesh: Mesh, client: Deployment, service: Service, port: int,
              request: RequestShape) -> RouteChoice | Problem:
    """The route of the VirtualService the client's sidecar uses for the service that takes the request."""
    host = service.hostname()
    vs, problem = istioroutes.mesh_virtual_service(mesh, host, client.namespace)
    if problem:
        return Problem(problem)
    if vs is None:
        return RouteChoice(None)
    routes = istioroutes.http_routes(vs)
    if vs.spec.get("tcp") or vs.spec.get("tls"):
        return Problem(f"{vs.key} has tcp or tls routes")
    taken = istioroutes.first_route(routes, request, port, client.namespace, client.labels)
    if taken is None:
        return Problem(f"{vs.key}: a match the check does not evaluate")
    return RouteChoice(taken if isinstance(taken, HttpRoute) else None)


def subset_deployments(plan: MeshPlan, client_namespace: str, host: str, subset: str) -> list[Deployment] | Problem:
    """The deployments (with pods) behind an FQDN and subset, as the client's DestinationRule defines it."""
    mesh = plan.mesh
    service = next((s for s in mesh.services if s.hostname() == host), None)
    if service is None:
        return Problem(f"{host} is not a service of the mesh file")
    backends = live(plan, mesh.backends(service))
    if not subset:
        return backends
    rule = istiopolicy.destination_rule(mesh, host, client_namespace)
    if rule is None:
        return Problem(f"the DestinationRule of {host} has a workloadSelector")
    if subset not in rule.subsets:
        return Problem(f"no DestinationRule defines subset {subset} of {host}")
    labels = rule.subsets[subset]
    return [d for d in backends if all(d.labels.get(k) == v for k, v in labels.items())]


def reached(plan: MeshPlan, client: Deployment, service: Service,
            choice: RouteChoice) -> list[tuple[str, list[Deployment], float]] | Problem:
    """Each destination a request can go to: (label, its deployments, its share of requests)."""
    route = choice.route
    if route is None:
        backends = live(plan, plan.mesh.backends(service))
        return [(service.name, backends, 1.0)] if backends else Problem(f"{service.key} has no pods")
    if not route.destinations:
        return Problem(f"{route.label} routes nowhere (redirect or direct response)")
    total = sum(d.weight for d in route.destinations) or 1
    out = []
    for dest in route.destinations:
        found = subset_deployments(plan, client.namespace, dest.host, dest.subset)
        if isinstance(found, Problem):
            return found
        if not found and dest.weight:
            return Problem(f"{route.label}: {dest.host} subset {dest.subset or '-'} has no pods")
        label = dest.host.split(".")[0] + (f" {dest.subset}" if dest.subset else "")
        out.append((label, found, dest.weight / total))
    return out


def server_request(shape: RequestShape, service: Service, port: int, principal: str, host: str) -> Request:
    """The request as the server's sidecar sees it (on the service's target port)."""
    target = next((p.target_port for p in service.ports if p.port == port), port)
    return Request(shape.method, shape.path, host, target, principal, dict(shape.headers))


def authorize_all(mesh: Mesh, servers: list[Deployment], request: Request) -> Decision:
    """One decision for every server deployment (None when they differ or one is not derivable)."""
    decisions = [istiopolicy.authorize(mesh, d.namespace, d.labels, request) for d in servers]
    if not decisions:
        return Decision(True, "no servers")
    if any(d.allowed is None for d in decisions):
        return next(d for d in decisions if d.allowed is None)
    if len({d.allowed for d in decisions}) > 1:
        return Decision(None, "the servers' AuthorizationPolicies decide differently")
    return decisions[0]


def mtls_to(mesh: Mesh, client: Deployment, service: Service, servers: list[Deployment]) -> bool | Problem:
    """Whether a sidecar client's request to the service carries its identity (mTLS)."""
    rule = istiopolicy.destination_rule(mesh, service.hostname(), client.namespace)
    if rule is None:
        return Problem(f"the DestinationRule of {service.hostname()} has a workloadSelector")
    if rule.tls_mode in ("ISTIO_MUTUAL",):
        return True
    if rule.tls_mode == "DISABLE":
        return False
    if rule.tls_mode:
        return Problem(f"{rule.resource.key if rule.resource else ''}: tls mode {rule.tls_mode}")
    modes = set()
    for server in servers:
        if server.mode == "none":
            modes.add(False)
            continue
        mode = istiopolicy.workload_mode(mesh, server.namespace, server.labels)
        modes.add(mode != "DISABLE")
    if len(modes) > 1:
        return Problem(f"{service.key}: some servers take mTLS and some do not")
    return modes.pop() if modes else True


def hop_target(mesh: Mesh, target: Target) -> Service | None:
    return mesh.service(target.service) if target.service else None


def chain_ok(plan: MeshPlan, server: Deployment, headers: Mapping[str, str] | None = None,
             depth: int = 0) -> bool | Problem:
    """Whether `server`'s app answers 200: each of its next hops (called as itself, with the `end-user`
    header passed on) gets through and answers 200 in turn."""
    mesh = plan.mesh
    if server.app.kind != "http-echo" or not server.app.next:
        return True
    if depth >= MAX_CHAIN:
        return Problem(f"the chain of next hops through {server.name} is too long to follow")
    passed = {k: v for k, v in (headers or {}).items() if k == "end-user"}
    for hop in server.app.next:
        service = hop_target(mesh, hop)
        if service is None:
            return Problem(f"{server.name} calls service entry {hop.host}")
        if hop.protocol not in ("HTTP", "HTTP2"):
            return Problem(f"{server.name} calls {hop.label}, not HTTP")
        shape = RequestShape(headers=passed)
        verdict = request_outcome(plan, server, service, hop.port, shape, depth + 1)
        if isinstance(verdict, Problem):
            return verdict
        if verdict != 200:
            return False
    return True


def request_outcome(plan: MeshPlan, client: Deployment, service: Service, port: int, shape: RequestShape,
                    depth: int = 0, chain: bool = True) -> int | Problem:
    """The status a sidecar client gets for a request to a service: a fault's, 403 from RBAC, 502 from a
    broken chain (`chain=False`: the app answers without calling its next hops), 200; a Problem where it
    cannot be derived."""
    mesh = plan.mesh
    choice = route_for(mesh, client, service, port, shape)
    if isinstance(choice, Problem):
        return choice
    route = choice.route
    if route is not None and route.abort_status and route.abort_percent >= 100:
        return route.abort_status
    if route is not None and ((route.abort_status and route.abort_percent > 0) or route.delay_s):
        return Problem(f"{route.label} injects a fault")
    destinations = reached(plan, client, service, choice)
    if isinstance(destinations, Problem):
        return destinations
    servers = [d for _, deployments, share in destinations if share > 0 for d in deployments]
    mtls = mtls_to(mesh, client, service, servers)
    if isinstance(mtls, Problem):
        return mtls
    principal = principal_of(client.namespace, client.service_account) if mtls else ""
    decision = authorize_all(mesh, servers, server_request(shape, service, port, principal, service.hostname()))
    if decision.allowed is None:
        return Problem(decision.reason)
    if not decision.allowed:
        return 403
    if not chain:
        return 200
    results = {chain_ok(plan, d, shape.headers, depth) for d in servers}
    problems = [r for r in results if isinstance(r, Problem)]
    if problems:
        return problems[0]
    return 200 if results == {True} else 502
