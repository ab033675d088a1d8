"""Reading the pods and istiod-local: the view's I/O edge.

Per pod and round (every second): the agent's `/healthz/ready` and, for a
sidecar, Envoy's per-cluster stats (`stats.ENVOY_STATS_PATH`). Every
`slow_every` rounds also the agent's metrics (certificates, xDS pushes and
NACKs, DNS) and Envoy's `/certs` (the identity it serves), which cost the agent
a merge of Envoy's stats and change slowly. Each pod's connections are made in
its network namespace and kept alive (`netns.HttpGetter`); pods are read on a
few threads at once. istiod-local's monitoring port is read the same way
(`/metrics` every round, `/debug/connections` every slow round).
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

from istiod_local.meshview.model import IstiodSample, PodSample, ViewTarget
from istiod_local.meshview.netns import HttpGetter
from istiod_local.meshview.stats import (
    ENVOY_STATS_FILTER,
    AgentStats,
    parse_agent_metrics,
    parse_envoy_stats,
    prometheus_samples,
)

ENVOY_STATS_QUERY = "/stats?format=json&usedonly&histogram_buckets=cumulative&filter=" + quote(ENVOY_STATS_FILTER,
                                                                                                safe="")


@dataclass(frozen=True)
class Certificate:
    identity: str
    expiry: float | None
    serial: str


def _rfc3339(text: str) -> float | None:
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def parse_certs(text: str | bytes) -> Certificate | None:
    """The workload certificate in Envoy's admin `/certs`: the chain with a SPIFFE URI SAN expiring last."""
    best: Certificate | None = None
    for entry in json.loads(text).get("certificates", []):
        for cert in entry.get("cert_chain", []) or []:
            uris = [s.get("uri", "") for s in cert.get("subject_alt_names", []) or [] if "uri" in s]
            identity = next((u for u in uris if u.startswith("spiffe://")), "")
            if not identity:
                continue
            expiry = _rfc3339(str(cert.get("expiration_time", "")))
            found = Certificate(identity, expiry, str(cert.get("serial_number", "")))
            if best is None or (expiry or 0) > (best.expiry or 0):
                best = found
    return best


def parse_pem_certificate(data: bytes) -> Certificate | None:
    """The first certificate of a PEM chain with a SPIFFE URI SAN (ValueError if it is not PEM)."""
    from istio_agent.pki import certs

    for cert in certs.load_pem_chain(data):
        identity = next((u for u in certs.uri_sans(cert) if u.startswith("spiffe://")), "")
        if identity:
            return Certificate(identity, certs.not_after(cert), certs.serial_hex(cert))
    return None


def parse_istiod_metrics(text: str, at: float, source: str = "istiod-local") -> IstiodSample:
    """istiod-local's `/metrics` to a sample (`controlplane/monitoring.py` writes them, with upstream's names:
    the real istiod's read the same way, `source` saying whose)."""
    connected = 0.0
    pushes: dict[str, float] = {}
    rejects: dict[str, float] = {}
    last_push: float | None = None
    version = ""
    for name, labels, value in prometheus_samples(text):
        if name == "pilot_xds":
            connected += value
        elif name in ("pilot_xds_pushes", "pilot_xds_pushes_total"):
            pushes[labels.get("type", "")] = value
        elif name in ("pilot_total_xds_rejects", "pilot_total_xds_rejects_total"):
            rejects[labels.get("type", "")] = value
        elif name == "istiod_local_last_push_timestamp_seconds":
            last_push = value or None
        elif name == "istiod_local_mesh_version":
            version = str(int(value))
    return IstiodSample(at, True, int(connected), (), pushes, rejects, last_push, version, name=source)


class _PodReader:
    """One pod's kept-alive connections and what its last slow round read."""

    def __init__(self, target: ViewTarget, timeout: float) -> None:
        self.target = target
        self.status = HttpGetter(target.netns, target.admin_host, target.status_port, timeout)
        self.admin = HttpGetter(target.netns, target.admin_host, target.admin_port, timeout)
        self.agent: AgentStats | None = None
        self.cert: Certificate | None = None

    def read(self, at: float, slow: bool) -> PodSample:
        target = self.target
        sample = PodSample(target, at)
        if target.mode == "none":
            return sample
        errors = []
        try:
            status, _ = self.status.get("/healthz/ready")
            sample = replace(sample, ready=status == 200)
        except OSError as exc:
            errors.append(f"status port: {exc}")
        if slow or self.agent is None:
            try:
                status, body = self.status.get("/stats/prometheus")
                if status == 200:
                    self.agent = parse_agent_metrics(body.decode("utf-8", "replace"))
            except OSError as exc:
                errors.append(f"agent metrics: {exc}")
        if target.mode == "sidecar":
            try:
                status, body = self.admin.get(ENVOY_STATS_QUERY)
                if status == 200:
                    sample = replace(sample, envoy=parse_envoy_stats(body))
                else:
                    errors.append(f"Envoy stats: HTTP {status}")
            except (OSError, ValueError) as exc:
                errors.append(f"Envoy admin: {exc}")
            if slow or self.cert is None:
                try:
                    status, body = self.admin.get("/certs")
                    if status == 200:
                        self.cert = parse_certs(body) or self.cert
                except (OSError, ValueError) as exc:
                    errors.append(f"Envoy certs: {exc}")
        elif target.cert_file and (slow or self.cert is None):
            try:
                with open(target.cert_file, "rb") as handle:
                    self.cert = parse_pem_certificate(handle.read(256 * 1024)) or self.cert
            except FileNotFoundError:
                pass  # not written yet: the agent writes it once it has a certificate
            except (OSError, ValueError) as exc:
                errors.append(f"certificate file: {exc}")
        if self.cert is not None:
            sample = replace(sample, identity=self.cert.identity, cert_expiry=self.cert.expiry,
                             cert_serial=self.cert.serial)
        return replace(sample, agent=self.agent, error="; ".join(errors))

    def close(self) -> None:
        self.status.close()
        self.admin.close()


def split_address(address: str) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or `http://host:port` to (host, port)."""
    text = address.split("://", 1)[-1].rstrip("/")
    host, _, port = text.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


class Collector:
    """Samples pods and istiod-local; `close()` drops every connection and stops the threads."""

    def __init__(self, istiod_monitoring: str | None = None, istiod_netns: str | None = None,
                 slow_every: int = 5, timeout: float = 2.0, workers: int = 4,
                 istiod_name: str = "istiod-local") -> None:
        self.slow_every = max(1, slow_every)
        self.istiod_name = istiod_name
        self.timeout = timeout
        self._readers: dict[tuple[str, str], _PodReader] = {}
        self._round = 0
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="meshview")
        self._lock = threading.Lock()
        self._istiod: HttpGetter | None = None
        if istiod_monitoring:
            host, port = split_address(istiod_monitoring)
            self._istiod = HttpGetter(istiod_netns, host, port, timeout)
        self._proxies: tuple[str, ...] = ()

    def sample(self, targets: Sequence[ViewTarget], at: float) -> tuple[list[PodSample], IstiodSample | None]:
        """One round: every target (in order) and istiod-local; readers of pods that left are closed."""
        slow = self._round % self.slow_every == 0
        self._round += 1
        wanted = {t.key: t for t in targets}
        for key in list(self._readers):
            reader = self._readers[key]
            if key not in wanted or reader.target != wanted[key]:
                reader.close()
                del self._readers[key]
        readers = [self._readers.setdefault(t.key, _PodReader(t, self.timeout)) for t in targets]
        futures = [self._pool.submit(r.read, at, slow) for r in readers]
        istiod = self._sample_istiod(at, slow)
        return [f.result() for f in futures], istiod

    def _sample_istiod(self, at: float, slow: bool) -> IstiodSample | None:
        if self._istiod is None:
            return None
        try:
            status, body = self._istiod.get("/metrics")
            if status != 200:
                return IstiodSample(at, error=f"/metrics: HTTP {status}", name=self.istiod_name)
            sample = parse_istiod_metrics(body.decode("utf-8", "replace"), at, self.istiod_name)
            if self.istiod_name == "istiod-local" and (slow or not self._proxies):  # istiod's is on its debug port
                status, body = self._istiod.get("/debug/connections")
                if status == 200:
                    self._proxies = _proxy_ids(json.loads(body))
            return replace(sample, proxies=self._proxies)
        except (OSError, ValueError) as exc:
            return IstiodSample(at, error=str(exc) or type(exc).__name__, name=self.istiod_name)

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
        if self._istiod is not None:
            self._istiod.close()
        self._pool.shutdown(wait=True)


def _proxy_ids(document: Any) -> tuple[str, ...]:
    clients = document.get("clients", []) if isinstance(document, dict) else []
    return tuple(str(c.get("connectionId", "")) for c in clients if isinstance(c, dict))
