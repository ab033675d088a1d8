"""The agent's own metrics (`istio_agent_*`), first on the merged page of :15020.

One `CollectorRegistry` (`istio_agent.metrics`, which renders as prometheus_client
does without its import cost) per agent (never a process-wide one: two agents
may share a process), built by the agent and handed to every component that
exports metrics (the DNS proxy registers its own on it). `AgentMetrics` owns the
rest, fed in three ways that need no changes to the components' logic:

- **read at scrape time** from state the components already keep: certificate
  expiry from `SecretCache.snapshot()`, certificates issued from
  `SecretCache.issued`, file secret and watcher failures from the cache, the XDS
  proxy's request/response totals and largest request from `XdsProxy.stats`;
- **existing callbacks**: `SecretCache.on_update` counts every pushed secret
  change (rotation, new root, file change) as a rotation of that resource;
- **small wrappers and hooks**: `metered_signer()` wraps the CA client to time
  each CSR and count its final gRPC code, `ca_retry` hears its retries;
  `xds_event()` is the XDS proxy's event hook (streams, pushes, NACKs, how each
  side of a stream ended), `sds_event()` the SDS server's (pushes and how long
  their writes took, NACKs, stale nonces), `envoy_ready()` readiness's.

Every family upstream's agent exports on :15020 is here under upstream's name,
labels and type (`docs/PILOT-AGENT.md#metrics` lists them, and the few it does not
have, with why; `tests/e2e/test_agent_metrics_upstream.py` compares the lists of
two running agents): upstream's sums are `Sum`s, written as upstream writes them
(`istio_agent_xds_proxy_requests 8`, no `_total` added); the `pilot_xds_*`
families are pkg/xds's, which upstream's SDS server and XDS proxy record. The
rest are ours, prefixed the same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from istio_agent.metrics import (
    CollectorRegistry,
    Counter,
    CounterMetricFamily,
    Gauge,
    GaugeMetricFamily,
    Histogram,
    Metric,
    ProcessCollector,
    Sum,
    SumMetricFamily,
)
from istio_agent.metrics.process import process_start_time
from istio_agent.protos import typeurls

if TYPE_CHECKING:
    from istio_agent.security.ca_client import CertificateSigner
    from istio_agent.security.cache import SecretCache
    from istio_agent.security.core.secrets import SecretItem
    from istio_agent.xds.proxy import XdsProxy

log = logging.getLogger(__name__)

CSR = "csr"  # upstream's request_type for CA calls
CA_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SEND_TIME_BUCKETS = (0.01, 0.1, 1, 3, 5, 10, 20, 30)  # pkg/xds's pilot_xds_send_time
TERMINATION_TYPES = ("cancelled", "error")  # upstream's `type` of the connection terminations
SDS = "sds"  # pkg/xds's type label of the SDS server's own NACKs and stale nonces

# xds_event kinds (the XDS proxy's hook vocabulary)
XDS_CONNECT = "connect"  # detail: "sotw" | "delta"
XDS_DISCONNECT = "disconnect"  # detail: "sotw" | "delta"
XDS_PUSH = "push"  # detail: type URL of a response forwarded to Envoy or consumed by the agent
XDS_ENVOY_NACK = "envoy_nack"  # detail: type URL Envoy rejected
XDS_AGENT_NACK = "agent_nack"  # detail: type URL the agent rejected (NDS, PCDS)
XDS_UPSTREAM_FAILURE = "upstream_failure"  # detail: why (dial failure or gRPC code)
XDS_UPSTREAM_END = "upstream_end"  # detail: "cancelled" | "error" (istiod's side of a stream ended)
XDS_DOWNSTREAM_END = "downstream_end"  # detail: "cancelled" | "error" (Envoy's side of a stream ended)
# sds_event kinds (security/sds.py's, repeated so that importing this module loads no SDS server)
SDS_SENT, SDS_REJECTED, SDS_EXPIRED_NONCE, SDS_INTERNAL_ERROR = "sent", "rejected", "expired_nonce", "internal_error"


def type_label(type_url: str) -> str:
    """`cds`, `lds`, `nds`, ... for known types (as Istio's own xDS metrics), else the URL."""
    short = typeurls.short(type_url)
    return short.lower() if short != type_url else type_url


class MeteredSigner:
    """A `CertificateSigner` that times every CSR and records its outcome, then defers to `inner`."""

    def __init__(self, inner: CertificateSigner, metrics: AgentMetrics) -> None:
        self.inner = inner
        self.metrics = metrics

    async def sign(self, csr_pem: bytes, ttl_seconds: int) -> list[str]:
        started = time.monotonic()
        code = "OK"
        try:
            return await self.inner.sign(csr_pem, ttl_seconds)
        except BaseException as exc:
            status = getattr(exc, "code", None)
            code = getattr(status, "name", None) or type(exc).__name__
            raise
        finally:
            self.metrics.ca_request(code, time.monotonic() - started)

    async def close(self) -> None:
        await self.inner.close()


class AgentMetrics:
    """Registers the agent's metrics on `registry` and takes events from the components."""

    def __init__(self, registry: CollectorRegistry, *, clock: Callable[[], float] = time.time,
                 process_metrics: bool = True) -> None:
        self.registry = registry
        self._clock = clock
        self._cache: SecretCache | None = None
        self._xds: XdsProxy | None = None
        self._root_expiry: dict[bytes, float] = {}
        self._process_start = process_start_time()
        self._ready_after: float | None = None
        # Upstream's sums (security/pkg/nodeagent/cache, security/pkg/monitoring, pkg/istio-agent/metrics).
        self.outgoing_requests = Sum(
            "istio_agent_num_outgoing_requests",
            "Number of total outgoing requests (e.g. to a token exchange server, CA, etc.)",
            ["request_type"], registry=registry)
        self.failed_outgoing_requests = Sum(
            "istio_agent_num_failed_outgoing_requests",
            "Number of failed outgoing requests (e.g. to a token exchange server, CA, etc.)",
            ["request_type"], registry=registry)
        self.outgoing_latency = Sum(
            "istio_agent_outgoing_latency",
            "The latency of outgoing requests (e.g. to a token exchange server, CA, etc.) in milliseconds.",
            ["request_type"], registry=registry)
        self.outgoing_retries = Sum(
            "istio_agent_num_outgoing_retries",
            "Number of outgoing retry requests (e.g. to a token exchange server, CA, etc.)",
            ["request_type"], registry=registry)
        self.istiod_failures = Sum(
            "istio_agent_istiod_connection_failures", "The total number of connection failures to Istiod",
            registry=registry)
        self.istiod_terminations = Sum(
            "istio_agent_istiod_connection_terminations", "The total number of connection errors to Istiod",
            ["type"], registry=registry)
        self.envoy_terminations = Sum(
            "istio_agent_envoy_connection_terminations", "The total number of connection errors from envoy",
            ["type"], registry=registry)
        # pkg/xds's, which upstream's SDS server records (its XDS proxy: the largest request, read at scrape).
        self.xds_rejects = Sum(
            "istio_agent_pilot_total_xds_rejects", "Total number of XDS responses from pilot rejected by proxy.",
            ["type"], registry=registry)
        self.expired_nonces = Sum(
            "istio_agent_pilot_xds_expired_nonce", "Total number of XDS requests with an expired nonce.",
            ["type"], registry=registry)
        self.write_timeouts = Sum(
            "istio_agent_pilot_xds_write_timeout", "Pilot XDS response write timeouts.", registry=registry)
        self.internal_errors = Sum(
            "istio_agent_pilot_total_xds_internal_errors", "Total number of internal XDS errors in pilot.",
            registry=registry)
        self.send_time = Histogram(
            "istio_agent_pilot_xds_send_time", "Total time in seconds Pilot takes to send generated configuration.",
            buckets=SEND_TIME_BUCKETS, registry=registry)
        # Ours.
        self.ca_requests = Counter(
            "istio_agent_ca_requests", "CSRs sent to the CA, by final gRPC status code (after retries).",
            ["code"], registry=registry)
        self.ca_duration = Histogram(
            "istio_agent_ca_request_duration_seconds", "Time to get a certificate from the CA, retries included.",
            buckets=CA_LATENCY_BUCKETS, registry=registry)
        self.cert_rotations = Counter(
            "istio_agent_cert_rotations", "Secret changes pushed to Envoy (rotation, new root, file change).",
            ["resource_name"], registry=registry)
        self.xds_connections = Gauge(
            "istio_agent_xds_proxy_connections", "Envoy xDS streams currently proxied.", ["mode"], registry=registry)
        self.xds_streams = Counter(
            "istio_agent_xds_proxy_streams", "Envoy xDS streams accepted.", ["mode"], registry=registry)
        self.xds_pushes = Counter(
            "istio_agent_xds_pushes", "xDS responses from istiod forwarded to Envoy or consumed by the agent.",
            ["type"], registry=registry)
        self.xds_nacks = Counter(
            "istio_agent_xds_nacks", "xDS responses rejected, by type and by whom (envoy or agent).",
            ["type", "by"], registry=registry)
        self.status_malformed_requests = Counter(
            "istio_agent_status_malformed_requests", "Requests to the status port that did not parse (answered 400).",
            registry=registry)
        # Series present at 0 from the start, so that rate() and alerts have a baseline.
        for mode in ("sotw", "delta"):
            self.xds_connections.labels(mode)
        for family in (self.outgoing_requests, self.failed_outgoing_requests, self.outgoing_latency,
                       self.outgoing_retries):
            family.labels(CSR)
        for kind in TERMINATION_TYPES:
            self.istiod_terminations.labels(kind)
            self.envoy_terminations.labels(kind)
        self.ca_requests.labels("OK")
        registry.register(_StateCollector(self))
        if process_metrics:
            ProcessCollector(namespace="istio_agent", registry=registry, go_extras=True)

    # --- feeding -------------------------------------------------------------------------------------------
    def watch_secrets(self, cache: SecretCache) -> None:
        """Read certificate state from `cache` at scrape time and count its pushes as rotations."""
        self._cache = cache
        cache.on_update(self.secret_changed)

    def watch_xds(self, proxy: XdsProxy) -> None:
        """Export the XDS proxy's own request/response totals."""
        self._xds = proxy

    def secret_changed(self, resource_name: str) -> None:
        self.cert_rotations.labels(resource_name).inc()

    def metered_signer(self, inner: CertificateSigner) -> MeteredSigner:
        return MeteredSigner(inner, self)

    def ca_retry(self) -> None:
        """The CA client is about to call again after a transient failure."""
        self.outgoing_retries.labels(CSR).inc()

    def envoy_ready(self) -> None:
        """Envoy was found ready for the first time: the agent's start-up took this long (upstream's
        startup_duration_seconds: from the process's start, as /proc tells it)."""
        if self._ready_after is None and self._process_start is not None:
            self._ready_after = max(0.0, self._clock() - self._process_start)

    def ca_request(self, code: str, seconds: float) -> None:
        """One CSR round (retries included) ended with gRPC `code` ("OK" on success) after `seconds`."""
        self.outgoing_requests.labels(CSR).inc()
        self.outgoing_latency.labels(CSR).inc(seconds * 1000.0)
        if code != "OK":
            self.failed_outgoing_requests.labels(CSR).inc()
        self.ca_requests.labels(code).inc()
        self.ca_duration.observe(seconds)

    def xds_event(self, kind: str, detail: str) -> None:
        """The XDS proxy's hook; unknown kinds are ignored so the proxy may report more later."""
        if kind == XDS_PUSH:
            self.xds_pushes.labels(type_label(detail)).inc()
        elif kind == XDS_ENVOY_NACK:
            self.xds_nacks.labels(type_label(detail), "envoy").inc()
        elif kind == XDS_AGENT_NACK:
            self.xds_nacks.labels(type_label(detail), "agent").inc()
        elif kind == XDS_CONNECT:
            self.xds_streams.labels(detail).inc()
            self.xds_connections.labels(detail).inc()
        elif kind == XDS_DISCONNECT:
            self.xds_connections.labels(detail).dec()
        elif kind == XDS_UPSTREAM_FAILURE:
            if detail == "dial":
                self.istiod_failures.inc()
        elif kind == XDS_UPSTREAM_END:
            self.istiod_terminations.labels(detail).inc()
        elif kind == XDS_DOWNSTREAM_END:
            self.envoy_terminations.labels(detail).inc()

    def sds_event(self, kind: str, seconds: float) -> None:
        """The SDS server's hook (pkg/xds's metrics of upstream's SDS server); unknown kinds are ignored."""
        if kind == SDS_SENT:
            self.send_time.observe(seconds)
        elif kind == SDS_REJECTED:
            self.xds_rejects.labels(SDS).inc()
        elif kind == SDS_EXPIRED_NONCE:
            self.expired_nonces.labels(SDS).inc()
        elif kind == SDS_INTERNAL_ERROR:
            self.internal_errors.inc()

    # --- read at scrape time -------------------------------------------------------------------------------
    def expiry(self, item: SecretItem) -> float | None:
        """When `item` stops being valid: its leaf's expiry, or a bundle's earliest root expiry."""
        if not item.is_root:
            return item.expires or None
        cached = self._root_expiry.get(item.root_cert)
        if cached is None:
            from istio_agent.pki import certs

            try:
                cached = min(certs.not_after(c) for c in certs.load_pem_chain(item.root_cert))
            except (ValueError, TypeError):
                return None
            if len(self._root_expiry) > 16:
                self._root_expiry.clear()
            self._root_expiry[item.root_cert] = cached
        return cached

    def collect_state(self) -> Iterator[Metric]:
        remaining = GaugeMetricFamily(
            "istio_agent_cert_expiry_seconds",
            "The time remaining, in seconds, before the certificate chain will expire. "
            "A negative value indicates the cert is expired.", labels=["resource_name"])
        at = GaugeMetricFamily(
            "istio_agent_cert_expiry_timestamp_seconds",
            "When the certificate chain expires, in seconds since the epoch.", labels=["resource_name"])
        cache, now = self._cache, self._clock()
        if cache is not None:
            for item in cache.snapshot():
                expires = self.expiry(item)
                if expires is not None:
                    remaining.add_metric([item.resource_name], expires - now)
                    at.add_metric([item.resource_name], expires)
        yield remaining
        yield at
        yield CounterMetricFamily("istio_agent_certificates_issued", "Workload certificates obtained from the CA.",
                                  value=cache.issued if cache is not None else 0)
        yield SumMetricFamily("istio_agent_num_file_secret_failures_total",
                              "Number of times secret generation failed for files",
                              value=cache.file_failures if cache is not None else 0)
        yield SumMetricFamily("istio_agent_num_file_watcher_failures_total",
                              "Number of times file watcher failed to add watchers",
                              value=cache.file_watch_failures if cache is not None else 0)
        stats: Any = self._xds.stats if self._xds is not None else None
        yield SumMetricFamily("istio_agent_xds_proxy_requests", "The total number of Xds Proxy Requests",
                              value=stats.requests if stats is not None else 0)
        yield SumMetricFamily("istio_agent_xds_proxy_responses", "The total number of Xds Proxy Responses",
                              value=stats.responses if stats is not None else 0)
        yield GaugeMetricFamily("istio_agent_pilot_xds_recv_max", "The maximum size request we have received so far.",
                                value=stats.max_request if stats is not None else 0)
        # Absent until Envoy has been ready once, as upstream's (which records it only then).
        startup = GaugeMetricFamily("istio_agent_startup_duration_seconds",
                                    "The time from the process starting to being marked ready.")
        if self._ready_after is not None:
            startup.add_metric((), self._ready_after)
        yield startup


class _StateCollector:
    def __init__(self, metrics: AgentMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self._metrics.collect_state()
