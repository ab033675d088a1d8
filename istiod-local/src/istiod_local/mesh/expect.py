"""`up --check`'s logic without I/O: which probes to make, what the mesh file says each must give, and
how an answer is read.

Probes: each deployment's first pod is a client. A sidecar pod calls every
service port by clusterIP and, with DNS capture, by name, and every service
entry by name; a proxyless `grpc-client` pod calls every GRPC port over
xDS (`xds:///host:port`, through its app's control port); a pod outside the
mesh calls each service's first backend pod directly on its target port, in
plaintext (it has no capture, so a clusterIP leads nowhere).

Expectations: an entry of the mesh file's `expectations:` that matches the
probe (client deployment, service or entry, optionally port) and has an
`outcome` says it; otherwise the policies do, as upstream Istio decides
them (an entry's `headers` are added either way: an HTTP answer that gets
through must carry them, as a WasmPlugin adds them):

- through the mesh (sidecar or proxyless client): mTLS presenting the
  client's SPIFFE id, unless the server pods are outside the mesh or their
  namespace's PeerAuthentication is DISABLE (then plaintext: auto mTLS
  sends TLS only where it will be accepted); refused when the service has
  no endpoints; a service entry's endpoint gets plaintext (unless it is a
  sidecar pod of a STRICT namespace, which refuses it);
- plaintext from outside the mesh: a sidecar in a STRICT namespace refuses
  it, PERMISSIVE and DISABLE accept it; a proxyless gRPC server refuses it
  under STRICT and PERMISSIVE too (gRPC cannot serve TLS and plaintext on
  one port, so upstream's PERMISSIVE means mTLS for mesh pods); a pod
  outside the mesh accepts it.

With Istio config (`istioConfig:`), the same probes follow it
(`traffic.py`): PeerAuthentication decides each server workload's mode, a
DestinationRule's `tls.mode: DISABLE` sends plaintext, an HTTP probe a
server's AuthorizationPolicy denies is `denied` (a 403 from the RBAC
filter), a VirtualService route decides which servers answer (a fault
aborting every request gives its status), and a server whose next hop
fails answers 502. Where the config says something the check does not
evaluate, the probe's outcome is "not checked" (`UNKNOWN`): the run lists it
apart and never counts it as held. Services whose pods are gateways are not
probed pairwise: a gateway is checked from the host (`configcheck.py`).

Observations: an HTTP answer's `x-forwarded-client-cert` (`URI=` is the
client identity the server-side Envoy verified); a gRPC reply's peer
identities (the proxyless server's view); otherwise the client Envoy's
`ssl.handshake` counter of the target's outbound cluster (TCP, gRPC behind a
server sidecar), which proves mTLS but not the identity it carried. A 403
whose body is Envoy's `RBAC: access denied` is `denied`. An HTTP answer's
response headers are kept for the expectations that name some.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from istiod_local.mesh import istiopolicy, istioroutes, traffic
from istiod_local.mesh.istioroutes import RequestShape
from istiod_local.mesh.model import AGENTS, GRPC_CONTROL_PORT, Deployment, Expectation, Mesh, Service
from istiod_local.mesh.planner import MeshPlan, pod_name

MTLS, PLAINTEXT, REFUSED, DENIED = "mtls", "plaintext", "refused", "denied"
UNKNOWN = "not checked"  # the config says something the check does not evaluate: listed apart, never held
RBAC_DENIED = "RBAC: access denied"  # the body of Envoy's RBAC filter's 403
_KIND = {"HTTP": "http", "HTTP2": "http", "GRPC": "grpc", "TCP": "tcp"}


@dataclass(frozen=True)
class Probe:
    """One call the check makes from `pod` (the first pod of `client`)."""

    client: str  # "<namespace>/<deployment>"
    pod: str
    kind: str  # http | tcp | grpc | grpc-xds
    address: str  # URL, host:port or xds target, as the probe app takes it
    target: str  # what the table shows: "<host>:<port>" or "<pod>:<port>"
    via: str  # "clusterIP" | "DNS" | "xDS" | "pod IP"
    service: str = ""  # "<namespace>/<service>"
    entry: str = ""  # service entry name
    backend: str = ""  # "<namespace>/<deployment>" a pod-IP probe goes to
    cluster: str = ""  # the client Envoy's outbound cluster ("outbound|port||host"), "" without a sidecar
    port: int = 0  # the service (or entry) port the probe is for

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "address": self.address}


@dataclass(frozen=True)
class Outcome:
    kind: str  # mtls | plaintext | refused
    identity: str = ""  # the client SPIFFE id the server saw ("" when not observable or not mTLS)
    detail: str = ""
    # Expected: the response headers an answer must carry. Observed: an HTTP answer's response headers.
    headers: tuple[tuple[str, str], ...] = ()

    def show(self) -> str:
        if self.kind == MTLS:
            shown = f"mtls {self.identity}" if self.identity else "mtls (TLS stats)"
        elif self.kind == DENIED:
            shown = "denied (403 RBAC)"
        else:
            shown = self.kind
        return shown + "".join(f", {name}: {value}" for name, value in self.headers)

    def show_against(self, expected: Outcome) -> str:
        """An observed outcome, with the headers `expected` names (their values, or that they are missing)."""
        got = dict(self.headers)
        shown = Outcome(self.kind, self.identity).show()
        if self.kind not in (MTLS, PLAINTEXT):
            return shown
        return shown + "".join(f", {name}: {got[name]}" if name in got else f", no {name}"
                               for name, _ in expected.headers)


def _address(protocol: str, host: str, port: int) -> str:
    kind = _KIND[protocol]
    return f"http://{host}:{port}/" if kind == "http" else f"{host}:{port}"


def probes(plan: MeshPlan, pod_ips: Mapping[str, str]) -> list[Probe]:
    """Every probe of the check, given the pods' addresses (for the probes from outside the mesh)."""
    mesh = plan.mesh
    out: list[Probe] = []
    for client in mesh.deployments:  # gateway pods call nothing: no probes from them
        pod = plan.first_pod(client)
        if pod is None:
            continue
        if client.mode == "sidecar":
            out += _sidecar_probes(plan, client, pod)
        elif client.mode == "proxyless" and client.app.kind == "grpc-client":
            for service in mesh.services:
                for port in service.ports:
                    if port.protocol == "GRPC":
                        host = service.hostname()
                        out.append(Probe(client.key, pod, "grpc-xds", f"xds:///{host}:{port.port}",
                                         f"{host}:{port.port}", "xDS", service=service.key, port=port.port))
        elif client.mode == "none":
            out += _plaintext_probes(plan, client, pod, pod_ips)
    return out


def _sidecar_probes(plan: MeshPlan, client: Deployment, pod: str) -> list[Probe]:
    mesh, out = plan.mesh, []
    for service in mesh.services:
        if traffic.is_gateway_service(mesh, service):
            continue
        for port in service.ports:
            host = service.hostname()
            cluster = f"outbound|{port.port}||{host}"
            kind = _KIND[port.protocol]
            ways = [("clusterIP", plan.cluster_ips[service.key])] + ([("DNS", host)] if client.dns_capture else [])
            for via, address in ways:
                out.append(Probe(client.key, pod, kind, _address(port.protocol, address, port.port),
                                 f"{host}:{port.port}", via, service=service.key, cluster=cluster, port=port.port))
    if client.dns_capture:
        for entry in mesh.service_entries:
            for port in entry.ports:
                host = entry.hosts[0]
                out.append(Probe(client.key, pod, _KIND[port.protocol], _address(port.protocol, host, port.port),
                                 f"{host}:{port.port}", "DNS", entry=entry.name,
                                 cluster=f"outbound|{port.port}||{host}", port=port.port))
    return out


def _plaintext_probes(plan: MeshPlan, client: Deployment, pod: str, pod_ips: Mapping[str, str]) -> list[Probe]:
    mesh, out = plan.mesh, []
    for service in mesh.services:
        if traffic.is_gateway_service(mesh, service):
            continue
        backend = next((b for b in mesh.backends(service) if plan.first_pod(b) is not None), None)
        if backend is None or backend.key == client.key:
            continue
        server_pod = pod_name(backend, 1)
        ip = pod_ips.get(server_pod)
        if not ip:
            continue
        for port in service.ports:
            out.append(Probe(client.key, pod, _KIND[port.protocol], _address(port.protocol, ip, port.target_port),
                             f"{server_pod}:{port.target_port}", "pod IP", service=service.key,
                             backend=backend.key, port=port.port))
    return out


def _live_backends(plan: MeshPlan, service: Service) -> list[Deployment]:
    return [b for b in plan.mesh.backends(service) if plan.first_pod(b) is not None]


def _plaintext_accepted(mesh: Mesh, server: Deployment) -> Outcome:
    if server.mode == "none":
        return Outcome(PLAINTEXT, detail="the server is outside the mesh")
    mode = istiopolicy.workload_mode(mesh, server.namespace, server.labels)
    if mode is None:
        return Outcome(UNKNOWN, detail=f"{server.name}: a PeerAuthentication with portLevelMtls")
    if server.mode == "proxyless" and mode != "DISABLE":
        return Outcome(REFUSED, detail=f"proxyless gRPC server under {mode}: mTLS only")
    if mode == "STRICT":
        return Outcome(REFUSED, detail="STRICT refuses plaintext")
    return Outcome(PLAINTEXT, detail=f"{mode} accepts plaintext")


def _matching(mesh: Mesh, probe: Probe) -> list[Expectation]:
    """The `expectations:` entries for this probe's client and target (and port, when they name one)."""
    def target(wanted: Expectation) -> bool:
        return bool((wanted.service and wanted.service == probe.service)
                    or (wanted.entry and wanted.entry == probe.entry))

    return [wanted for wanted in mesh.expectations
            if wanted.client == probe.client and (not wanted.port or wanted.port == probe.port) and target(wanted)]


def declared(mesh: Mesh, probe: Probe) -> Outcome | None:
    """The mesh file's own `expectations:` outcome for this probe, if an entry with one matches (the last wins)."""
    found = None
    for wanted in _matching(mesh, probe):
        if wanted.outcome:
            client = mesh.deployment(probe.client)
            identity = mesh.spiffe_id(client) if client is not None and wanted.outcome == MTLS else ""
            found = Outcome(wanted.outcome, identity, "declared in the mesh file")
    return found


def declared_headers(mesh: Mesh, probe: Probe) -> tuple[tuple[str, str], ...]:
    """The response headers the matching `expectations:` entries name for an HTTP probe (a later entry's value
    for a name wins)."""
    if probe.kind != "http":
        return ()
    headers: dict[str, str] = {}
    for wanted in _matching(mesh, probe):
        headers.update(wanted.headers)
    return tuple(sorted(headers.items()))


def expect(plan: MeshPlan, probe: Probe) -> Outcome:
    """What the mesh file says `probe` must give: its declared expectation, else what its policies say; with
    the headers its expectations name when the answer is to get through."""
    outcome = _expect(plan, probe)
    headers = declared_headers(plan.mesh, probe)
    if headers and outcome.kind in (MTLS, PLAINTEXT):
        return Outcome(outcome.kind, outcome.identity, outcome.detail, headers)
    return outcome


def _expect(plan: MeshPlan, probe: Probe) -> Outcome:
    mesh = plan.mesh
    client = mesh.deployment(probe.client)
    assert client is not None
    stated = declared(mesh, probe)
    if stated is not None:
        return stated
    if probe.backend:  # from outside the mesh, straight to a pod
        backend = mesh.deployment(probe.backend)
        assert backend is not None
        return _through_server(plan, probe, backend, _plaintext_accepted(mesh, backend))
    if probe.entry:
        entry = mesh.entry(probe.entry)
        assert entry is not None
        servers = [d for e in entry.endpoints if e.deployment
                   for d in [mesh.deployment(e.deployment)] if d is not None and plan.first_pod(d) is not None]
        if not servers and not any(e.address for e in entry.endpoints):
            return Outcome(REFUSED, detail="the service entry has no endpoints")
        return _plaintext_accepted(mesh, servers[0]) if servers else Outcome(PLAINTEXT, detail="external endpoint")
    service = mesh.service(probe.service)
    assert service is not None
    backends = _live_backends(plan, service)
    if not backends:
        return Outcome(REFUSED, detail="the service has no endpoints")
    if mesh.istio_config and client.mode != "sidecar" and _configured(plan, service, backends):
        return Outcome(UNKNOWN, detail=f"{service.key}: routes or policies for a proxyless client are not derived")
    if mesh.istio_config and client.mode == "sidecar":
        return _through_mesh(plan, probe, client, service)
    server = backends[0]
    if server.mode == "none":
        return Outcome(PLAINTEXT, detail="the server is outside the mesh: no mTLS")
    mode = istiopolicy.workload_mode(mesh, server.namespace, server.labels)  # the file's, or its Istio config's
    if mode is None:
        return Outcome(UNKNOWN, detail=f"{server.name}: a PeerAuthentication with portLevelMtls")
    if mode == "DISABLE":
        return Outcome(PLAINTEXT, detail="DISABLE: auto mTLS sends plaintext")
    return Outcome(MTLS, mesh.spiffe_id(client), detail=f"{mode} namespace")


def _configured(plan: MeshPlan, service: Service, backends: list[Deployment]) -> bool:
    """Whether Istio config routes the service or authorizes its servers."""
    mesh = plan.mesh
    vs = any(service.hostname() in istioroutes.hosts_of(v) for v in mesh.resources("VirtualService"))
    return vs or any(istiopolicy.authorization_policies(mesh, b.namespace, b.labels) for b in backends)


def _through_mesh(plan: MeshPlan, probe: Probe, client: Deployment, service: Service) -> Outcome:
    """A sidecar client's probe with Istio config: the route, the servers' modes and policies, the chain."""
    mesh = plan.mesh
    choice = traffic.route_for(mesh, client, service, probe.port, RequestShape())
    if isinstance(choice, traffic.Problem):
        return Outcome(UNKNOWN, detail=choice.reason)
    destinations = traffic.reached(plan, client, service, choice)
    if isinstance(destinations, traffic.Problem):
        return Outcome(UNKNOWN, detail=destinations.reason)
    servers = [d for _, deployments, share in destinations if share > 0 for d in deployments]
    mtls = traffic.mtls_to(mesh, client, service, servers)
    if isinstance(mtls, traffic.Problem):
        return Outcome(UNKNOWN, detail=mtls.reason)
    modes = {istiopolicy.workload_mode(mesh, s.namespace, s.labels) for s in servers if s.mode != "none"}
    if None in modes:
        return Outcome(UNKNOWN, detail=f"{service.key}: a PeerAuthentication with portLevelMtls")
    if mtls and any(s.mode == "none" for s in servers):
        return Outcome(REFUSED, detail="mTLS to a server outside the mesh")
    if not mtls and "STRICT" in modes:
        return Outcome(REFUSED, detail="plaintext to a STRICT server")
    if probe.kind != "http":
        if any(istiopolicy.authorization_policies(mesh, s.namespace, s.labels) for s in servers):
            return Outcome(UNKNOWN, detail=f"{service.key}: AuthorizationPolicy on {probe.kind} is not evaluated")
        if choice.route is not None:
            return Outcome(UNKNOWN, detail=f"{choice.route.label}: an HTTP route for a {probe.kind} probe")
    else:
        status = traffic.request_outcome(plan, client, service, probe.port, RequestShape())
        if isinstance(status, traffic.Problem):
            return Outcome(UNKNOWN, detail=status.reason)
        if status == 403:
            return Outcome(DENIED, detail="AuthorizationPolicy")
        if status != 200:
            return Outcome(REFUSED, detail=f"HTTP {status}")
    if mtls:
        return Outcome(MTLS, mesh.spiffe_id(client), detail="mTLS")
    return Outcome(PLAINTEXT, detail="plaintext")


def _through_server(plan: MeshPlan, probe: Probe, server: Deployment, accepted: Outcome) -> Outcome:
    """Plaintext from outside the mesh that the server's sidecar took: its AuthorizationPolicy, its chain."""
    mesh = plan.mesh
    if accepted.kind != PLAINTEXT or server.mode == "none" or not mesh.istio_config:
        return accepted
    policies = istiopolicy.authorization_policies(mesh, server.namespace, server.labels)
    if probe.kind != "http":
        return Outcome(UNKNOWN, detail=f"{server.name}: AuthorizationPolicy on {probe.kind}") if policies \
            else accepted
    service = mesh.service(probe.service)
    assert service is not None
    decision = traffic.authorize_all(mesh, [server], traffic.server_request(
        RequestShape(), service, probe.port, "", probe.address.split("/")[2]))
    if decision.allowed is None:
        return Outcome(UNKNOWN, detail=decision.reason)
    if not decision.allowed:
        return Outcome(DENIED, detail=decision.reason)
    chain = traffic.chain_ok(plan, server)
    if isinstance(chain, traffic.Problem):
        return Outcome(UNKNOWN, detail=chain.reason)
    return accepted if chain else Outcome(REFUSED, detail="HTTP 502: a next hop failed")


def _identity_from_xfcc(xfcc: str) -> str:
    """The client's `URI=` of the last element (the hop that reached this server)."""
    last = xfcc.split(",")[-1]
    for part in last.split(";"):
        key, _, value = part.partition("=")
        if key.strip() == "URI":
            return value.strip().strip('"')
    return ""


def observe(probe: Probe, raw: Mapping[str, Any], tls_handshakes: int | None) -> Outcome:
    """Read one probe's answer (`apps.probe_one`'s JSON) and the client Envoy's TLS handshakes on its cluster
    during the probes (None: no sidecar to ask)."""
    if not raw.get("answered"):
        return Outcome(REFUSED, detail=str(raw.get("error", "no answer")))
    tls = bool(tls_handshakes)
    if probe.kind == "http":
        status = raw.get("status")
        if status == 403 and str(raw.get("text", "")).startswith(RBAC_DENIED):
            return Outcome(DENIED, detail=RBAC_DENIED)
        if status != 200:
            return Outcome(REFUSED, detail=f"HTTP {status}")
        identity = _identity_from_xfcc(str(raw.get("xfcc", "")))
        got = raw.get("headers")
        headers = tuple(sorted((str(k), str(v)) for k, v in got.items())) if isinstance(got, Mapping) else ()
        if identity:
            return Outcome(MTLS, identity, headers=headers)
        return Outcome(PLAINTEXT, detail="no client certificate seen", headers=headers)
    if probe.kind in ("grpc", "grpc-xds"):
        identities = list(raw.get("identities") or [])
        if identities:
            return Outcome(MTLS, str(identities[0]))
        return Outcome(MTLS, detail="client TLS handshakes") if tls else Outcome(PLAINTEXT)
    return Outcome(MTLS, detail="client TLS handshakes") if tls else Outcome(PLAINTEXT)


def holds(expected: Outcome, observed: Outcome) -> bool:
    """The expectation held: same outcome, the same identity wherever the server could show one, and every
    header it names, with its value."""
    if expected.kind != observed.kind or expected.kind == UNKNOWN:
        return False
    if expected.identity and observed.identity and expected.identity != observed.identity:
        return False
    got = dict(observed.headers)
    return all(got.get(name) == value for name, value in expected.headers)


@dataclass(frozen=True)
class Row:
    probe: Probe
    expected: Outcome
    observed: Outcome

    @property
    def ok(self) -> bool:
        return holds(self.expected, self.observed)


def _short(text: str, limit: int = 48) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _agent(deployment: Deployment | None) -> str:
    return "none" if deployment is None or deployment.mode == "none" else deployment.agent


def agents(plan: MeshPlan, probe: Probe) -> str:
    """Whose agents a probe went between, `client→server` ("istio-agent", "upstream", "none" outside the mesh;
    a service whose pods run both shows both, joined by `+`)."""
    mesh = plan.mesh
    if probe.backend:
        servers = [mesh.deployment(probe.backend)]
    elif probe.entry:
        entry = mesh.entry(probe.entry)
        servers = [mesh.deployment(e.deployment) for e in (entry.endpoints if entry else ()) if e.deployment]
    else:
        service = mesh.service(probe.service)
        servers = list(_live_backends(plan, service)) if service is not None else []
    server = "+".join(dict.fromkeys(_agent(d) for d in servers)) or "-"
    return f"{_agent(mesh.deployment(probe.client))}→{server}"


def mixed(plan: MeshPlan) -> bool:
    """Whether the mesh runs upstream's agent anywhere (the table then says whose agents each probe went between)."""
    return any(d.agent != AGENTS[0] and d.mode != "none" for d in plan.mesh.deployments)


class ShownRow(Protocol):
    """A row of another kind of expectation (`checking.ConfigRow`): its probe names client, target and via."""

    @property
    def probe(self) -> Any: ...

    @property
    def observed(self) -> Any: ...

    @property
    def ok(self) -> bool: ...


def _cells(row: Row | ShownRow, plan: MeshPlan | None, show_agents: bool) -> tuple[str, ...]:
    if isinstance(row, Row):
        return (row.probe.pod, row.probe.target, row.probe.via,
                *((agents(plan, row.probe),) if show_agents and plan is not None else ()), row.expected.show(),
                row.observed.show_against(row.expected) + (f" ({_short(row.observed.detail)})"
                                                            if row.observed.kind == REFUSED and row.observed.detail
                                                            else ""), "ok" if row.ok else "FAIL")
    probe: Any = row.probe
    return (probe.pod or probe.client, probe.target, probe.via, *(("-",) if show_agents else ()),
            f"{probe.want.text} [{probe.source}]", str(row.observed), "ok" if row.ok else "FAIL")


def table(rows: Sequence[Row | ShownRow], plan: MeshPlan | None = None) -> str:
    """One table: client, target, via, expected, observed, ok; with a `plan` that mixes agent implementations,
    also `agents` (client→server, `agents()`)."""
    show_agents = plan is not None and mixed(plan)
    head = ("client", "target", "via", *(("agents",) if show_agents else ()), "expected", "observed", "ok")
    cells = [head] + [_cells(r, plan, show_agents) for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in cells]
    passed = sum(r.ok for r in rows)
    lines.append(f"{passed}/{len(rows)} expectations held")
    return "\n".join(lines)


def control_port() -> int:
    """Where a proxyless grpc-client takes the check's calls (its app's control port)."""
    return GRPC_CONTROL_PORT
