"""`up --check`'s expectations derived from Istio config, and how an answer is judged (pure).

Beside the pairwise probes (`expect.py`), each HTTP route of a VirtualService
bound to the mesh, and each AuthorizationPolicy with rules on methods or
paths, becomes probes: series of requests from one client pod, through its
sidecar, each carrying `x-echo-next: skip` so that the answering app does
not call its own next hops (what is checked is this one hop):

- a route to one destination: every answer from that destination's pods
  (the DestinationRule's subset) over `ROUTE_REQUESTS`;
- weighted destinations: each one's share of `SHIFT_REQUESTS` within
  `TOLERANCE` (absolute) of its weight;
- a fault: an abort's status (every answer, or its percentage's share within
  the tolerance), a delay's answers taking at least the delay;
- a timeout of at most `MAX_TIMEOUT`: a request whose app answers a second
  after it (`x-echo-sleep`) gets Envoy's 504;
- an AuthorizationPolicy: its rules' methods and paths (and one that none
  allows), from a client of each principal its rules name and one of none,
  allowed (200) or denied by the RBAC filter (403 `RBAC: access denied`).

The request for a route is made to take it (`istioroutes.request_for`) and
checked to reach it; the client is a sidecar deployment that sees the
VirtualService, satisfies its `sourceLabels`, and is allowed by the
servers' AuthorizationPolicies (callers of the service first). Whatever the
check cannot derive is returned as a note ("not checked"), never as a probe.
Gateways are checked from the host: `gatewaycheck.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from istiod_local.mesh import istiopolicy, istioroutes, traffic, wasmplugins
from istiod_local.mesh.istioroutes import HttpRoute, RequestShape
from istiod_local.mesh.model import Deployment, IstioResource, Service
from istiod_local.mesh.planner import MeshPlan

TOLERANCE = 0.10
SHIFT_REQUESTS = 200
ROUTE_REQUESTS = 20
ABORT_REQUESTS = 10
DELAY_REQUESTS = 2
MAX_TIMEOUT = 5.0
SLEEP_PAST_TIMEOUT = 1.0
SKIP_NEXT = ("x-echo-next", "skip")
SLEEP_HEADER = "x-echo-sleep"
RBAC_DENIED = "RBAC: access denied"
FROM_HOST = "host"
HTTP = ("HTTP", "HTTP2")
APPLIED_ONLY = ("ServiceEntry", "WorkloadEntry", "WorkloadGroup", "Sidecar", "EnvoyFilter", "ProxyConfig",
                "RequestAuthentication", "Telemetry", "WasmPlugin")


@dataclass(frozen=True)
class Want:
    """What a series of answers must show."""

    text: str
    status: int = 200
    status_share: float = 1.0  # of answers with `status` (the others answer 200)
    backends: tuple[tuple[str, frozenset[str], float], ...] = ()  # (label, pods, share of the 200s)
    min_elapsed: float = 0.0


@dataclass(frozen=True)
class ConfigProbe:
    source: str  # what the probe checks: "VirtualService default/reviews http[1]"
    client: str  # "<namespace>/<deployment>", or "host"
    pod: str  # the client pod; "" from the host
    url: str
    target: str
    via: str
    method: str
    headers: tuple[tuple[str, str], ...]
    count: int
    want: Want
    hosts: tuple[str, ...] = ()  # names resolved to 127.0.0.1 for a probe from the host
    timeout: float = 3.0

    def as_json(self) -> dict[str, Any]:
        return {"kind": "http-series", "address": self.url, "method": self.method, "headers": dict(self.headers),
                "count": self.count, "timeout": self.timeout}


@dataclass
class Derived:
    probes: list[ConfigProbe] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ---- judging --------------------------------------------------------------------------------------


def judge(probe: ConfigProbe, raw: Mapping[str, Any]) -> tuple[str, bool]:
    """(what was observed, whether it is what `probe.want` says)."""
    results = raw.get("results") if raw.get("answered") else None
    if not results:
        return f"no answer: {raw.get('error', '')}"[:60], False
    want = probe.want
    statuses = [int(r[0] or 0) for r in results]
    ok_pods = [str(r[1]) for r in results if r[0] == 200]
    count = len(results)
    hits = sum(s == want.status for s in statuses)
    if want.status_share >= 1.0:
        good = hits == count
    else:
        good = abs(hits / count - want.status_share) <= TOLERANCE and all(s in (want.status, 200) for s in statuses)
    shown = _statuses(statuses)
    if want.status == 403 and good:
        good = all(str(r[3]).startswith(RBAC_DENIED) for r in results if r[0] == 403)
        shown += "" if good else " (not RBAC's)"
    if want.min_elapsed:
        fastest = min(float(r[2]) for r in results)
        shown += f", fastest {fastest:.2f} s"
        good = good and fastest >= want.min_elapsed
    if want.backends and ok_pods:
        shares = []
        for label, pods, share in want.backends:
            mine = sum(p in pods for p in ok_pods) / len(ok_pods)
            shares.append(f"{label} {mine:.0%}")
            good = good and (abs(mine - share) <= TOLERANCE if share < 1.0 else mine == 1.0)
        known = frozenset().union(*(pods for _, pods, _ in want.backends))
        stray = sorted({p for p in ok_pods if p not in known})
        good = good and not stray
        shown += ": " + ", ".join(shares) + (f", others {', '.join(stray)}" if stray else "")
    return shown, good


def _statuses(statuses: Sequence[int]) -> str:
    counts: dict[int, int] = {}
    for status in statuses:
        counts[status] = counts.get(status, 0) + 1
    return " ".join(f"{'no answer' if s == 0 else f'HTTP {s}'} x{n}" for s, n in sorted(counts.items()))


# ---- clients --------------------------------------------------------------------------------------


def callers_first(plan: MeshPlan, service: Service) -> list[Deployment]:
    """Sidecar deployments with a pod: those whose app calls the service, then the others, the service's own
    last, each in file order."""
    mesh = plan.mesh
    clients = [d for d in mesh.deployments if d.mode == "sidecar" and plan.first_pod(d) is not None]
    calls = [d for d in clients if any(t.service == service.key for t in (*d.app.next, *d.app.calls))]
    own = [d for d in clients if d not in calls and service.selects(d.namespace, d.labels)]
    return calls + [d for d in clients if d not in calls and d not in own] + own


def url(plan: MeshPlan, client: Deployment, service: Service, port: int, path: str) -> str:
    host = service.hostname() if client.dns_capture else plan.cluster_ips[service.key]
    return f"http://{host}:{port}{path}"


def pods_of(plan: MeshPlan, deployments: Sequence[Deployment]) -> frozenset[str]:
    return frozenset(p for d in deployments for p in plan.pods_of(d.key))


def _allowed(plan: MeshPlan, client: Deployment, service: Service, port: int, shape: RequestShape,
             servers: list[Deployment]) -> bool:
    mesh = plan.mesh
    mtls = traffic.mtls_to(mesh, client, service, servers)
    if isinstance(mtls, traffic.Problem):
        return False
    principal = istiopolicy.principal_of(client.namespace, client.service_account) if mtls else ""
    request = traffic.server_request(shape, service, port, principal, service.hostname())
    return traffic.authorize_all(mesh, servers, request).allowed is True


def _route_client(plan: MeshPlan, vs: IstioResource, service: Service, port: int, shape: RequestShape,
                  route: HttpRoute) -> tuple[Deployment, list[tuple[str, list[Deployment], float]]] | str:
    """A client the route is for and the servers allow, with the destinations it reaches; or why none."""
    mesh = plan.mesh
    routes = istioroutes.http_routes(vs)
    why = f"{route.label}: no sidecar client sees it"
    for client in callers_first(plan, service):
        seen, _ = istioroutes.mesh_virtual_service(mesh, service.hostname(), client.namespace)
        if seen != vs or istioroutes.first_route(routes, shape, port, client.namespace, client.labels) != route:
            continue
        reached = traffic.reached(plan, client, service, traffic.RouteChoice(route))
        if isinstance(reached, traffic.Problem):
            return reached.reason
        servers = [d for _, deployments, share in reached if share > 0 for d in deployments]
        if (route.abort_status and route.abort_percent >= 100) or _allowed(plan, client, service, port, shape, servers):
            return client, reached
        why = f"{route.label}: no client the servers' AuthorizationPolicies allow"
    return why


# ---- routes ---------------------------------------------------------------------------------------


def route_probes(plan: MeshPlan, derived: Derived) -> None:
    mesh = plan.mesh
    for vs in mesh.resources("VirtualService"):
        if istioroutes.MESH_GATEWAY not in istioroutes.gateways_of(vs):
            continue
        for key in ("tcp", "tls"):
            if vs.spec.get(key):
                derived.notes.append(f"{vs.key} ({vs.source}): {key} routes are applied, not checked")
        for host in istioroutes.hosts_of(vs):
            service = next((s for s in mesh.services if s.hostname() == host), None)
            ports = [p for p in service.ports if p.protocol in HTTP] if service is not None else []
            if service is None or not ports:
                derived.notes.append(f"{vs.key} ({vs.source}): host {host} is not an HTTP service of the mesh "
                                     "file: applied, not checked")
                continue
            for route in istioroutes.http_routes(vs):
                _route(plan, vs, service, ports[0].port, route, derived)


def _route(plan: MeshPlan, vs: IstioResource, service: Service, default_port: int, route: HttpRoute,
           derived: Derived) -> None:
    if route.unchecked:
        derived.notes.append(f"{route.label}: {', '.join(route.unchecked)}: applied, not checked")
    shape = istioroutes.request_for(route.matches[0] if route.matches else None)
    if shape is None:
        derived.notes.append(f"{route.label}: its match is not one the check can make a request for")
        return
    port = shape.port or default_port
    found = _route_client(plan, vs, service, port, shape, route)
    if isinstance(found, str):
        derived.notes.append(found)
        return
    client, reached = found
    pod = plan.first_pod(client)
    assert pod is not None
    headers = (*sorted(shape.headers.items()), SKIP_NEXT)
    target = f"{service.hostname()}:{port}"
    backends = tuple((label, pods_of(plan, deployments), share) for label, deployments, share in reached)
    routed = ", ".join(f"{label} {share:.0%}" if len(backends) > 1 else label for label, _, share in backends)

    def probe(want: Want, count: int, extra: tuple[tuple[str, str], ...] = (), timeout: float = 3.0) -> None:
        derived.probes.append(ConfigProbe(route.label, client.key, pod, url(plan, client, service, port, shape.path),
                                          target, f"{shape.show()} x{count}", shape.method, (*headers, *extra),
                                          count, want, timeout=timeout))

    if route.abort_status and route.abort_percent > 0:
        full = route.abort_percent >= 100
        share = route.abort_percent / 100
        text = f"HTTP {route.abort_status}" + ("" if full else f" {share:.0%}±{TOLERANCE:.0%}") + " (fault abort)"
        probe(Want(text, route.abort_status, share), ABORT_REQUESTS if full else SHIFT_REQUESTS)
        if route.delay_s:
            derived.notes.append(f"{route.label}: the delay of an aborting route is not checked")
        return
    if route.delay_s:
        if route.delay_percent < 100:
            derived.notes.append(f"{route.label}: a delay of {route.delay_percent:g}% of requests is not checked")
            return
        probe(Want(f"≥ {route.delay_s:g} s, then {routed}", backends=backends, min_elapsed=route.delay_s),
              DELAY_REQUESTS, timeout=route.delay_s + 5.0)
        return
    count = SHIFT_REQUESTS if len(backends) > 1 else ROUTE_REQUESTS
    tolerance = f" ±{TOLERANCE:.0%}" if len(backends) > 1 else ""
    probe(Want(f"{routed}{tolerance}", backends=backends), count)
    if route.timeout_s:
        if route.timeout_s > MAX_TIMEOUT:
            derived.notes.append(f"{route.label}: a timeout over {MAX_TIMEOUT:g} s is not checked")
            return
        sleep = route.timeout_s + SLEEP_PAST_TIMEOUT
        derived.probes.append(ConfigProbe(
            route.label, client.key, pod, url(plan, client, service, port, shape.path), target,
            f"{shape.show()} (app answers after {sleep:g} s)", shape.method,
            (*headers, (SLEEP_HEADER, f"{sleep:g}")), 1, Want(f"HTTP 504 (timeout {route.timeout_s:g} s)", 504),
            timeout=sleep + 5.0))


# ---- authorization ---------------------------------------------------------------------------------


def _expand(pattern: str) -> str:
    if pattern == "*":
        return "/"
    if pattern.endswith("*"):
        return pattern[:-1] + "x"
    if pattern.startswith("*"):
        return "/x" + pattern[1:]
    return pattern


def combos(policies: Sequence[IstioResource]) -> list[tuple[str, str]]:
    """Requests that tell the policies' rules apart: their methods and paths, and ones none of them lists."""
    out: list[tuple[str, str]] = []
    restricts_methods = restricts_paths = False
    for policy in policies:
        for rule in policy.spec.get("rules") or []:
            for to in (rule.get("to") or []) if isinstance(rule, Mapping) else []:
                operation = to.get("operation") or {} if isinstance(to, Mapping) else {}
                methods = [str(m) for m in operation.get("methods") or []] or ["GET"]
                paths = [_expand(str(p)) for p in operation.get("paths") or []] or ["/"]
                restricts_methods |= bool(operation.get("methods"))
                restricts_paths |= bool(operation.get("paths"))
                out += [(m, p) for m in methods[:2] for p in paths[:2]]
                out += [(str(m), "/") for m in (operation.get("notMethods") or [])[:1]]
                out += [("GET", _expand(str(p))) for p in (operation.get("notPaths") or [])[:1]]
    if restricts_methods:
        out.append(("POST", "/"))
    if restricts_paths:
        out.append(("GET", "/not-listed"))
    unique = [c for c in dict.fromkeys(out) if c != ("GET", "/") and "*" not in c[0]]
    return unique[:4]


def _named_principals(policies: Sequence[IstioResource]) -> list[str]:
    out = []
    for policy in policies:
        for rule in policy.spec.get("rules") or []:
            for source in (rule.get("from") or []) if isinstance(rule, Mapping) else []:
                part = source.get("source") or {} if isinstance(source, Mapping) else {}
                out += [str(p) for p in part.get("principals") or []]
    return out


def authz_clients(plan: MeshPlan, service: Service, policies: Sequence[IstioResource]) -> list[Deployment]:
    """One client per principal the rules name, and one the rules do not name."""
    named = _named_principals(policies)
    chosen: dict[str, Deployment] = {}
    unnamed: Deployment | None = None
    for client in callers_first(plan, service):
        principal = istiopolicy.principal_of(client.namespace, client.service_account)
        if any(istiopolicy.value_matches(p, principal) for p in named):
            chosen.setdefault(principal, client)
        elif unnamed is None:
            unnamed = client
    return [*chosen.values(), *([unnamed] if unnamed is not None else [])]


def authz_probes(plan: MeshPlan, derived: Derived) -> None:
    mesh = plan.mesh
    for service in mesh.services:
        ports = [p for p in service.ports if p.protocol in HTTP]
        servers = traffic.live(plan, mesh.backends(service))
        if not ports or not servers or traffic.is_gateway_service(mesh, service):
            continue
        policies = list({p.key: p for s in servers
                         for p in istiopolicy.authorization_policies(mesh, s.namespace, s.labels)}.values())
        requests = combos(policies)
        if not requests:
            continue
        port = ports[0].port
        source = "AuthorizationPolicy " + ", ".join(f"{p.namespace}/{p.name}" for p in policies)
        for client in authz_clients(plan, service, policies):
            pod = plan.first_pod(client)
            assert pod is not None
            for method, path in requests:
                shape = RequestShape(method, path)
                status = traffic.request_outcome(plan, client, service, port, shape, chain=False)
                if isinstance(status, traffic.Problem):
                    derived.notes.append(f"{source}: {method} {path} from {client.name}: {status.reason}")
                    continue
                text = "denied (403 RBAC)" if status == 403 else f"HTTP {status}"
                derived.probes.append(ConfigProbe(
                    source, client.key, pod, url(plan, client, service, port, path),
                    f"{service.hostname()}:{port}", f"{method} {path}", method, (SKIP_NEXT,), 1, Want(text, status)))


def _headers_expected(plan: MeshPlan, plugin: IstioResource) -> bool:
    """Whether an `expectations:` entry names response headers of a service whose pods the WasmPlugin selects
    (what a plugin does is the mesh file's to say: the check cannot derive it)."""
    mesh = plan.mesh
    chosen = {d.key for d in wasmplugins.selected(mesh, plugin)}
    for wanted in mesh.expectations:
        service = mesh.service(wanted.service) if wanted.service else None
        if wanted.headers and service is not None and any(d.key in chosen for d in mesh.backends(service)):
            return True
    return False


def notes_for_applied(plan: MeshPlan) -> list[str]:
    """Resources applied whose effect the check does not derive (a WasmPlugin whose headers an expectation
    names is checked by it)."""
    out = []
    for resource in plan.mesh.istio_config:
        if resource.kind == wasmplugins.KIND and _headers_expected(plan, resource):
            continue
        if resource.kind in APPLIED_ONLY:
            out.append(f"{resource.key} ({resource.source}): applied, not checked")
        elif resource.kind == "DestinationRule":
            policy = resource.spec.get("trafficPolicy") or {}
            fields = [k for k in ("connectionPool", "outlierDetection", "loadBalancer", "portLevelSettings")
                      if isinstance(policy, Mapping) and k in policy]
            if fields:
                out.append(f"{resource.key} ({resource.source}): {', '.join(fields)}: applied, not checked")
        elif resource.kind == "PeerAuthentication" and resource.spec.get("portLevelMtls"):
            out.append(f"{resource.key} ({resource.source}): portLevelMtls: applied, not checked")
    for service in plan.mesh.services:
        if traffic.is_gateway_service(plan.mesh, service):
            out.append(f"service {service.key}: its pods are gateways; they are checked from the host, not "
                       "pairwise")
    return out


def derive(plan: MeshPlan) -> Derived:
    """Every probe the mesh's Istio config gives, and what is not checked (gateways: `gatewaycheck`)."""
    derived = Derived()
    if not plan.mesh.istio_config:
        return derived
    route_probes(plan, derived)
    authz_probes(plan, derived)
    derived.notes += notes_for_applied(plan)
    return derived
