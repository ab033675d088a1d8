"""The live view's model: what was sampled (`PodSample`, `IstiodSample`), kept over a window (`History`),
and what is shown (`MeshView`), built by `build_view(history, now)`. Pure: time is passed in.

Rates and percentiles come from the oldest and newest sample of each pod inside
the window (`History.window` seconds), so one slow sample does not make a rate
jump, and a pod's restarted Envoy (its counters back at 0) counts from 0.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from istiod_local.meshview.stats import (
    AgentStats,
    EnvoyStats,
    Histogram,
    histogram_delta,
    increase,
    merge_histograms,
    quantile,
)

MODES = ("sidecar", "proxyless", "none")
UPSTREAM_AGENT = "upstream"  # `ViewTarget.agent` of a pod on upstream's Go pilot-agent
XDS_TYPES = ("cds", "eds", "lds", "rds", "nds")


@dataclass(frozen=True)
class ViewTarget:
    """One pod to watch. `netns`: a name under /var/run/netns, a path, or None (this process's namespace).

    `mode`: "sidecar" (agent + Envoy: admin on 127.0.0.1:`admin_port`), "proxyless" (agent only) or
    "none" (no mesh: only listed). The status port is the agent's :15020 inside the pod.
    `cert_file`: a PEM file on this host with the pod's workload certificate, read where no Envoy
    says which one it serves (a proxyless pod's OUTPUT_CERTS `cert-chain.pem`); "" for none.
    `agent`: whose pilot-agent the pod runs, "istio-agent" (ours) or "upstream" (upstream's Go one),
    shown beside its mode.
    """

    name: str
    namespace: str
    ip: str
    netns: str | None
    mode: str = "sidecar"
    service_account: str = "default"
    trust_domain: str = "cluster.local"
    admin_port: int = 15000
    status_port: int = 15020
    admin_host: str = "127.0.0.1"
    cert_file: str = ""
    agent: str = "istio-agent"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"ViewTarget {self.name}: mode {self.mode!r} is not one of {', '.join(MODES)}")

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    @property
    def expected_identity(self) -> str:
        return f"spiffe://{self.trust_domain}/ns/{self.namespace}/sa/{self.service_account}"


@dataclass(frozen=True)
class MeshEvent:
    """Something that changed the mesh (a file edit applied, a pod added): `at` epoch seconds."""

    at: float
    text: str
    source: str = "mesh"  # "mesh": given to the view; "view": a change the view itself saw


@dataclass(frozen=True)
class PodSample:
    """What one collection round read from one pod. `error` says what could not be read (the rest stays)."""

    target: ViewTarget
    at: float
    ready: bool | None = None  # None: not asked (mode none) or unreachable
    envoy: EnvoyStats | None = None
    agent: AgentStats | None = None
    identity: str = ""  # the URI SAN of the certificate Envoy (or the agent) holds
    cert_expiry: float | None = None
    cert_serial: str = ""
    error: str = ""


@dataclass(frozen=True)
class IstiodSample:
    """istiod-local's monitoring endpoint, read once."""

    at: float
    reachable: bool = False
    connected: int = 0
    proxies: tuple[str, ...] = ()
    pushes: Mapping[str, float] = field(default_factory=dict)  # pilot_xds_pushes by type
    rejects: Mapping[str, float] = field(default_factory=dict)  # pilot_total_xds_rejects by type
    last_push: float | None = None  # epoch seconds
    version: str = ""  # the mesh (snapshot) version in service
    error: str = ""
    name: str = "istiod-local"  # whose monitoring port: istiod-local's, or the real istiod's ("istiod")


@dataclass(frozen=True)
class XdsCounts:
    pushes: float = 0.0
    nacks: float = 0.0

    @property
    def acks(self) -> float:
        return max(0.0, self.pushes - self.nacks)


@dataclass(frozen=True)
class PodView:
    name: str
    namespace: str
    ip: str
    mode: str
    identity: str
    identity_confirmed: bool  # read from a certificate (not the one expected from the service account)
    ready: bool | None
    cert_expires_in: float | None
    rotations: int
    xds: Mapping[str, XdsCounts]
    dns_local: int
    dns_forwarded: int
    error: str = ""
    agent: str = "istio-agent"
    wasm_modules: int = 0  # Wasm modules its agent holds for Envoy (the WasmPlugins selecting it)
    wasm_failures: int = 0  # fetches of a module that failed


@dataclass(frozen=True)
class ServiceView:
    """One service as its clients' Envoys see it (outbound clusters), summed over the pods."""

    host: str
    rps: float
    errors_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    connections_per_s: float
    clients: int
    requests: float  # in the window

    @property
    def short(self) -> str:
        parts = self.host.split(".")
        return ".".join(parts[:2]) if self.host.endswith(".svc.cluster.local") else self.host


@dataclass(frozen=True)
class IstiodView:
    reachable: bool
    connected: int
    pushes: float
    rejects: float
    last_push_ago: float | None
    version: str
    error: str = ""
    name: str = "istiod-local"


@dataclass(frozen=True)
class MeshView:
    at: float
    pods: tuple[PodView, ...]
    services: tuple[ServiceView, ...]
    istiod: IstiodView | None
    events: tuple[MeshEvent, ...]

    def pod(self, name: str) -> PodView | None:
        return next((p for p in self.pods if p.name == name), None)

    def service(self, short_or_host: str) -> ServiceView | None:
        return next((s for s in self.services if short_or_host in (s.short, s.host)), None)


class History:
    """The samples of the last `window` seconds per pod (and one older, the baseline), recent events."""

    def __init__(self, window: float = 10.0, max_events: int = 8) -> None:
        self.window = window
        self._pods: dict[tuple[str, str], deque[PodSample]] = {}
        self._order: list[tuple[str, str]] = []
        self.istiod: IstiodSample | None = None
        self.events: deque[MeshEvent] = deque(maxlen=max_events)

    def add_pods(self, samples: Iterable[PodSample], now: float) -> None:
        """Record a round; pods absent from it are forgotten (they left the mesh)."""
        seen = []
        for sample in samples:
            key = sample.target.key
            seen.append(key)
            kept = self._pods.setdefault(key, deque())
            kept.append(sample)
            while len(kept) > 2 and kept[1].at <= now - self.window:
                kept.popleft()
        for key in set(self._pods) - set(seen):
            del self._pods[key]
        self._order = seen

    def add_istiod(self, sample: IstiodSample) -> None:
        self.istiod = sample

    def add_event(self, event: MeshEvent) -> None:
        self.events.append(event)

    def pods(self) -> list[tuple[PodSample, PodSample]]:
        """(oldest in the window, newest) per pod, in the order of the last round."""
        return [(self._pods[k][0], self._pods[k][-1]) for k in self._order if k in self._pods]


def _xds(agent: AgentStats | None) -> dict[str, XdsCounts]:
    if agent is None:
        return {}
    kinds = sorted(set(agent.xds_pushes) | set(agent.xds_nacks),
                   key=lambda k: (XDS_TYPES.index(k) if k in XDS_TYPES else len(XDS_TYPES), k))
    return {k: XdsCounts(agent.xds_pushes.get(k, 0.0), agent.xds_nacks.get(k, 0.0)) for k in kinds}


def _rotations(agent: AgentStats | None) -> int:
    """Certificates obtained after the first; the pushes of new secrets where the CA count is not exported."""
    if agent is None:
        return 0
    if agent.certificates_issued > 0:
        return int(agent.certificates_issued) - 1
    return max(0, int(agent.cert_rotations) - 1)


def pod_view(newest: PodSample, now: float) -> PodView:
    target, agent = newest.target, newest.agent
    expiry = newest.cert_expiry if newest.cert_expiry is not None else (agent.cert_expiry if agent else None)
    return PodView(
        name=target.name, namespace=target.namespace, ip=target.ip, mode=target.mode,
        identity=newest.identity or (target.expected_identity if target.mode != "none" else ""),
        identity_confirmed=bool(newest.identity),
        ready=newest.ready, cert_expires_in=None if expiry is None else expiry - now,
        rotations=_rotations(agent), xds=_xds(agent),
        dns_local=int(agent.dns_local) if agent else 0, dns_forwarded=int(agent.dns_forwarded) if agent else 0,
        error=newest.error, agent=target.agent if target.mode != "none" else "",
        wasm_modules=int(agent.wasm_modules) if agent else 0,
        wasm_failures=int(agent.wasm_fetch_failures) if agent else 0,
    )


def outbound_host(cluster: str) -> str | None:
    """`outbound|80|v1|echo.default.svc.cluster.local` -> the host; None for other clusters."""
    parts = cluster.split("|")
    if len(parts) != 4 or parts[0] != "outbound":
        return None
    return parts[3]


@dataclass
class _ServiceSum:
    rps: float = 0.0
    errors: float = 0.0
    cps: float = 0.0
    requests: float = 0.0
    clients: set[str] = field(default_factory=set)
    times: list[Histogram] = field(default_factory=list)


def service_views(pairs: Sequence[tuple[PodSample, PodSample]]) -> list[ServiceView]:
    """Per service host: request and error rates, connection rate and p50/p99 over each pod's window."""
    sums: dict[str, _ServiceSum] = {}
    for oldest, newest in pairs:
        if newest.envoy is None:
            continue
        before = oldest.envoy.clusters if oldest.envoy is not None and oldest is not newest else {}
        seconds = newest.at - oldest.at
        for cluster, now_stats in newest.envoy.clusters.items():
            host = outbound_host(cluster)
            if host is None:
                continue
            then = before.get(cluster)
            s = sums.setdefault(host, _ServiceSum())
            s.clients.add(newest.target.name)
            if then is None or seconds <= 0:
                continue  # no baseline yet: the next round has one
            requests = increase(then.rq_total, now_stats.rq_total)
            s.requests += requests
            s.rps += requests / seconds
            s.errors += increase(then.rq_5xx, now_stats.rq_5xx) / seconds
            s.errors += increase(then.cx_connect_fail, now_stats.cx_connect_fail) / seconds
            s.cps += increase(then.cx_total, now_stats.cx_total) / seconds
            delta = histogram_delta(then.rq_time, now_stats.rq_time)
            if delta is not None:
                s.times.append(delta)
    out = []
    for host in sorted(sums):
        s = sums[host]
        merged = merge_histograms(s.times)
        out.append(ServiceView(host, s.rps, s.errors, quantile(0.5, merged), quantile(0.99, merged), s.cps,
                               len(s.clients), s.requests))
    return out


def istiod_view(sample: IstiodSample | None, now: float) -> IstiodView | None:
    if sample is None:
        return None
    ago = None if sample.last_push is None else max(0.0, now - sample.last_push)
    return IstiodView(sample.reachable, sample.connected, sum(sample.pushes.values()), sum(sample.rejects.values()),
                      ago, sample.version, sample.error, sample.name)


def build_view(history: History, now: float) -> MeshView:
    pairs = history.pods()
    return MeshView(now, tuple(pod_view(newest, now) for _, newest in pairs), tuple(service_views(pairs)),
                    istiod_view(history.istiod, now), tuple(history.events))


def changes(before: MeshView | None, after: MeshView) -> list[str]:
    """One line per change between two views (the plain log, and the view's own events)."""
    lines: list[str] = []
    old = {(p.namespace, p.name): p for p in before.pods} if before is not None else {}
    new = {(p.namespace, p.name): p for p in after.pods}
    for key, pod in new.items():
        was = old.get(key)
        where = f"pod {pod.namespace}/{pod.name}"
        if was is None:
            lines.append(f"{where} added: {pod.ip} {pod.mode}" + (" (upstream's agent)" if pod.agent == UPSTREAM_AGENT
                                                                    else "")
                         + (f" {pod.identity}" if pod.identity else ""))
            if pod.ready:
                lines.append(f"{where} ready")
            continue
        if pod.ready != was.ready and pod.ready is not None:
            lines.append(f"{where} {'ready' if pod.ready else 'not ready'}")
        if pod.rotations > was.rotations:
            lines.append(f"{where} certificate rotated ({pod.rotations} so far)")
        if pod.identity_confirmed and pod.identity != was.identity:
            lines.append(f"{where} identity {pod.identity}")
        for kind, counts in pod.xds.items():
            if counts.nacks > was.xds.get(kind, XdsCounts()).nacks:
                lines.append(f"{where} rejected {kind.upper()} ({int(counts.nacks)} NACKs)")
        if pod.wasm_modules != was.wasm_modules:
            lines.append(f"{where} holds {pod.wasm_modules} Wasm module{'s' if pod.wasm_modules != 1 else ''}")
        if pod.wasm_failures > was.wasm_failures:
            lines.append(f"{where} failed to fetch a Wasm module ({pod.wasm_failures} so far)")
        if pod.error and pod.error != was.error:
            lines.append(f"{where}: {pod.error}")
    for key in old.keys() - new.keys():
        lines.append(f"pod {key[0]}/{key[1]} removed")
    old_services = {s.host: s for s in before.services} if before is not None else {}
    for service in after.services:
        was_active = (old_services[service.host].rps > 0) if service.host in old_services else False
        if service.rps > 0 and not was_active:
            lines.append(f"service {service.short}: traffic {service.rps:.1f} req/s")
        elif service.rps == 0 and was_active and service.connections_per_s == 0:
            lines.append(f"service {service.short}: no traffic")
    i0, i1 = before.istiod if before is not None else None, after.istiod
    if i1 is not None:
        if i0 is None or i1.reachable != i0.reachable:
            lines.append(f"{i1.name} monitoring " + ("reachable" if i1.reachable else f"unreachable: {i1.error}"))
        if i1.reachable:
            if i0 is None or i1.connected != i0.connected:
                lines.append(f"{i1.name}: {i1.connected} proxies connected")
            if i0 is not None and i1.version != i0.version and i1.version:
                lines.append(f"{i1.name} pushed mesh version {i1.version}")
            if i0 is not None and i1.pushes > i0.pushes and not i1.version:  # the real istiod shows no version
                lines.append(f"{i1.name}: {int(i1.pushes - i0.pushes)} pushes")
            if i0 is not None and i1.rejects > i0.rejects:
                lines.append(f"{i1.name}: {int(i1.rejects - i0.rejects)} more pushes rejected")
    old_events = set(before.events) if before is not None else set()
    lines += [event.text for event in after.events if event not in old_events and event.source == "mesh"]
    return lines
