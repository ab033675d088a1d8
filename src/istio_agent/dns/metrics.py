"""DNS proxy metrics on a caller-supplied registry (`istio_agent.metrics`).

Query outcomes are counted in plain per-thread lists (a lock-free `+= 1` on the
answering thread) and summed only when the registry is scraped: a prometheus
Counter takes a lock per increment, which would cost the hot path more than the
answer itself. Only the upstream latency histogram, on the slower forwarding
path, is a regular prometheus metric.

Exposed (names as upstream's agent, with the `istio_agent_` prefix):
  istio_agent_dns_queries_total{outcome,protocol}   local | forwarded | failed | malformed
  istio_agent_dns_requests_total                     all queries (upstream's dns_requests_total)
  istio_agent_dns_upstream_requests_total            queries sent upstream
  istio_agent_dns_upstream_failures_total            queries for which every upstream failed
  istio_agent_dns_upstream_request_duration_seconds  histogram of upstream round trips
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from istio_agent.dns.core.responder import FAILED, FORWARDED, LOCAL, MALFORMED
from istio_agent.metrics import CollectorRegistry, CounterMetricFamily, Histogram, Metric

UPSTREAM_FAILURES = 4  # counts index: subset of FAILED where all upstream servers failed
SLOTS = 5
OUTCOMES = (("local", LOCAL), ("forwarded", FORWARDED), ("failed", FAILED), ("malformed", MALFORMED))
# Upstream's buckets (.001 .. 5 s), sorted.
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.1, 1.0, 5.0)


class DnsMetrics:
    """Registers the DNS collectors on `registry` (a private one when None; never the global)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._lock = threading.Lock()
        self._counts: list[tuple[str, list[int]]] = []
        self.upstream_latency = Histogram(
            "istio_agent_dns_upstream_request_duration_seconds",
            "Time in seconds the agent takes to get a DNS response from upstream.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_CountsCollector(self))

    def counts(self, protocol: str) -> list[int]:
        """A fresh counts list owned by one thread; its increments need no lock."""
        counts = [0] * SLOTS
        with self._lock:
            self._counts.append((protocol, counts))
        return counts

    def totals(self) -> dict[tuple[str, str], int]:
        """(outcome, protocol) -> count, summed over every thread's list."""
        out: dict[tuple[str, str], int] = {}
        with self._lock:
            lists = list(self._counts)
        for protocol, counts in lists:
            for name, index in (*OUTCOMES, ("upstream_failures", UPSTREAM_FAILURES)):
                out[(name, protocol)] = out.get((name, protocol), 0) + counts[index]
        return out


class _CountsCollector:
    def __init__(self, metrics: DnsMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        totals = self._metrics.totals()
        queries = CounterMetricFamily("istio_agent_dns_queries", "DNS queries by outcome.",
                                      labels=["outcome", "protocol"])
        requests = upstream = failures = 0
        for (outcome, protocol), value in sorted(totals.items()):
            if outcome == "upstream_failures":
                failures += value
                continue
            queries.add_metric([outcome, protocol], value)
            requests += value
            if outcome == "forwarded":
                upstream += value
        yield queries
        yield CounterMetricFamily("istio_agent_dns_requests", "Total number of DNS requests.", value=requests)
        yield CounterMetricFamily("istio_agent_dns_upstream_requests",
                                  "Total number of DNS requests forwarded to upstream.", value=upstream + failures)
        yield CounterMetricFamily("istio_agent_dns_upstream_failures",
                                  "Total number of DNS requests for which every upstream failed.", value=failures)
