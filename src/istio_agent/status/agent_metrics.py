"""The agent's own metrics (`istio_agent_*`), first on the merged page of :15020.

One `CollectorRegistry` (`istio_agent.metrics`, which renders as prometheus_client
does without its import cost) per agent (never a process-wide one: two agents
may share a process), built by the agent and handed to every component that
exports metrics (the DNS proxy registers its own on it). `AgentMetrics` owns the
rest, fed in three ways that need no changes to the components' logic:

- **read at scrape time** from state the components already keep: certificate
  expiry from `SecretCache.snapshot()`, certificates issued from
  `SecretCache.issued`, the XDS proxy's request/response totals from
  `XdsProxy.stats`;
- **existing callbacks**: `SecretCache.on_update` counts every pushed secret
  change (rotation, new root, file change) as a rotation of that resource;
- **small wrappers and hooks**: `metered_signer()` wraps the CA client to time
  each CSR and count its final gRPC code; `xds_event()` is the XDS proxy's
  optional event hook (streams, pushes and NACKs by type).

Names follow upstream where upstream has the metric (`cert_expiry_seconds`,
`num_outgoing_requests`, `num_failed_outgoing_requests`, `outgoing_latency`,
`istiod_connection_failures`, `xds_proxy_requests`, `xds_proxy_responses`, the
process collector); the rest are ours, prefixed the same way.
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
)
from istio_agent.protos import typeurls

if TYPE_CHECKING:
    from istio_agent.security.ca_client import CertificateSigner
    from istio_agent.security.cache import SecretCache
    from istio_agent.security.core.secrets import SecretItem
    from istio_agent.xds.proxy import XdsProxy

log = logging.getLogger(__name__)

CSR = "csr"  # upstream's request_type for CA calls
CA_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# xds_event kinds (the XDS proxy's hook vocabulary)
XDS_CONNECT = "connect"  # detail: "sotw" | "delta"
XDS_DISCONNECT = "disconnect"  # detail: "sotw" | "delta"
XDS_PUSH = "push"  # detail: type URL of a response forwarded to Envoy or consumed by the agent
XDS_ENVOY_NACK = "envoy_nack"  # detail: type URL Envoy rejected
XDS_AGENT_NACK = "agent_nack"  # detail: type URL the agent rejected (NDS, PCDS)
XDS_UPSTREAM_FAILURE = "upstream_failure"  # detail: why (dial failure or gRPC code)


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
        self.outgoing_requests = Counter(
            "istio_agent_num_outgoing_requests",
            "Number of total outgoing requests (e.g. to a token exchange server, CA, etc.)",
            ["request_type"], registry=registry)
        self.failed_outgoing_requests = Counter(
            "istio_agent_num_failed_outgoing_requests",
            "Number of failed outgoing requests (e.g. to a token exchange server, CA, etc.)",
            ["request_type"], registry=registry)
        self.outgoing_latency = Counter(
            "istio_agent_outgoing_latency",
            "The latency of outgoing requests (e.g. to a token exchange server, CA, etc.) in milliseconds.",
            ["request_type"], registry=registry)
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
        self.istiod_failures = Counter(
            "istio_agent_istiod_connection_failures", "The total number of connection failures to Istiod",
            registry=registry)
        # Series present at 0 from the start, so that rate() and alerts have a baseline.
        for mode in ("sotw", "delta"):
            self.xds_connections.labels(mode)
        for counter in (self.outgoing_requests, self.failed_outgoing_requests, self.outgoing_latency):
            counter.labels(CSR)
        self.ca_requests.labels("OK")
        registry.register(_StateCollector(self))
        if process_metrics:
            ProcessCollector(namespace="istio_agent", registry=registry)

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
            self.istiod_failures.inc()

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
        stats: Any = self._xds.stats if self._xds is not None else None
        yield CounterMetricFamily("istio_agent_xds_proxy_requests", "The total number of Xds Proxy Requests",
                                  value=stats.requests if stats is not None else 0)
        yield CounterMetricFamily("istio_agent_xds_proxy_responses", "The total number of Xds Proxy Responses",
                                  value=stats.responses if stats is not None else 0)


class _StateCollector:
    def __init__(self, metrics: AgentMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self._metrics.collect_state()
