"""Parsing and arithmetic of the stats the view reads: pure functions, no I/O.

Two sources, each parsed once per sample:

* Envoy's admin `/stats?format=json&histogram_buckets=cumulative` (filtered by
  `ENVOY_STATS_FILTER`): counters keep their full, untagged names
  (`cluster.outbound|80||echo.default.svc.cluster.local.upstream_rq_total`), so
  no tag-extraction rule of the bootstrap can change what the view sees, and
  histograms come with their cumulative buckets;
* the agent's merged `/stats/prometheus` on :15020, of which only the
  `istio_agent_*` series are kept (certificates, xDS pushes and NACKs, DNS, Wasm modules).

Rates and percentiles are computed from two snapshots and the time between
them, as Prometheus' `rate()` and `histogram_quantile()` do (linear
interpolation inside the bucket, counter resets treated as a restart from 0).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# What Envoy must keep for the services table (ProxyConfig `proxyStatsMatcher.inclusionSuffixes`: Istio's
# default inclusion list drops every per-cluster stat; `up` puts these in each sidecar's ProxyConfig).
STATS_INCLUSION_SUFFIXES = ("upstream_rq_total", "upstream_rq_5xx", "upstream_rq_time", "upstream_cx_total",
                            "upstream_cx_connect_fail")
_SERVICE_STATS = "|".join(STATS_INCLUSION_SUFFIXES)
# Envoy's `filter` is an RE2 regex matched anywhere in the stat's full name.
ENVOY_STATS_FILTER = rf"^cluster\.(outbound|inbound)\|.*\.({_SERVICE_STATS})$"
ENVOY_STATS_PATH = f"/stats?format=json&usedonly&histogram_buckets=cumulative&filter={ENVOY_STATS_FILTER}"
# Histograms Envoy also splits by origin; the plain one already holds every request.
_SPLIT_HISTOGRAMS = (".external", ".internal", ".canary", ".zone")


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts by upper bound (ascending); the last bound may be +inf."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]

    @property
    def total(self) -> float:
        return self.counts[-1] if self.counts else 0.0


@dataclass(frozen=True)
class ClusterStats:
    """One Envoy cluster's request and connection counters and its request-time histogram (ms)."""

    rq_total: float = 0.0
    rq_5xx: float = 0.0
    cx_total: float = 0.0
    cx_connect_fail: float = 0.0
    rq_time: Histogram | None = None


@dataclass(frozen=True)
class EnvoyStats:
    clusters: Mapping[str, ClusterStats] = field(default_factory=dict)


@dataclass(frozen=True)
class AgentStats:
    """The agent's own series that the view shows, from its :15020 metrics."""

    cert_expiry: float | None = None  # epoch seconds of the `default` certificate's expiry
    cert_rotations: float = 0.0
    certificates_issued: float = 0.0
    xds_pushes: Mapping[str, float] = field(default_factory=dict)  # by type (cds, lds, ...)
    xds_nacks: Mapping[str, float] = field(default_factory=dict)  # by type, Envoy's and the agent's
    dns_local: float = 0.0
    dns_forwarded: float = 0.0
    dns_failed: float = 0.0
    wasm_modules: float = 0.0  # modules in the agent's Wasm cache (WasmPlugins' code it fetched for Envoy)
    wasm_fetch_failures: float = 0.0  # fetches of a module that failed, whatever the reason


def _split_cluster_stat(name: str) -> tuple[str, str] | None:
    """(cluster, stat) of a per-cluster stat; None for others and for the origin-split copies.

    istiod names a cluster's stats `<name>;` (its alt_stat_name, which Istio's tag rule cuts at the `;`),
    so `cluster.outbound|80||echo.default.svc.cluster.local;.upstream_rq_total`; a plain name is taken too.
    """
    if not name.startswith("cluster."):
        return None
    for stat in STATS_INCLUSION_SUFFIXES:
        if name.endswith("." + stat):
            cluster = name[len("cluster."):-len(stat) - 1]
            cluster, marked, rest = cluster.partition(";")
            if (marked and rest) or (not marked and cluster.endswith(_SPLIT_HISTOGRAMS)):
                return None  # `<name>;.external.upstream_rq_time` and the like: already in the plain one
            return cluster, stat
    return None


def parse_envoy_stats(text: str | bytes) -> EnvoyStats:
    """Envoy's JSON stats (with cumulative histogram buckets) to per-cluster counters (ValueError if not JSON)."""
    document = json.loads(text)
    values: dict[str, dict[str, float]] = {}
    times: dict[str, Histogram] = {}
    for entry in document.get("stats", []):
        if "histograms" in entry:
            histograms = entry["histograms"]
            items = histograms if isinstance(histograms, list) else histograms.get("computed_quantiles", [])
            for item in items:
                split = _split_cluster_stat(str(item.get("name", "")))
                buckets = item.get("buckets")
                if split is None or not isinstance(buckets, list):
                    continue
                bounds = tuple(float(b["upper_bound"]) for b in buckets)
                counts = tuple(float(b["cumulative"]) for b in buckets)
                times[split[0]] = Histogram(bounds, counts)
            continue
        split = _split_cluster_stat(str(entry.get("name", "")))
        if split is not None and isinstance(entry.get("value"), int | float):
            values.setdefault(split[0], {})[split[1]] = float(entry["value"])
    clusters = {}
    for name in sorted(set(values) | set(times)):
        v = values.get(name, {})
        clusters[name] = ClusterStats(v.get("upstream_rq_total", 0.0), v.get("upstream_rq_5xx", 0.0),
                                      v.get("upstream_cx_total", 0.0), v.get("upstream_cx_connect_fail", 0.0),
                                      times.get(name))
    return EnvoyStats(clusters)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def prometheus_samples(text: str, prefix: str = "") -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample line whose name starts with `prefix`; unparsable lines are skipped."""
    out = []
    for line in text.splitlines():
        if not line.startswith(prefix) or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(match.group(2) or "")}
        out.append((match.group(1), labels, value))
    return out


# Upstream's Go agent counts DNS in other series (every query, those forwarded, forwarding failures).
_UPSTREAM_DNS = {"istio_agent_dns_requests_total": "all", "istio_agent_dns_upstream_requests_total": "forwarded",
                 "istio_agent_dns_upstream_failures_total": "failed"}


def parse_agent_metrics(text: str) -> AgentStats:
    """The `istio_agent_*` series the view shows, from the agent's merged Prometheus text (ours; for upstream's Go
    agent its DNS counters, its xDS and certificate series having other shapes)."""
    expiry: float | None = None
    rotations = issued = 0.0
    pushes: dict[str, float] = {}
    nacks: dict[str, float] = {}
    dns = {"local": 0.0, "forwarded": 0.0, "failed": 0.0}
    upstream_dns = {"all": 0.0, "forwarded": 0.0, "failed": 0.0}
    wasm_modules = wasm_failures = 0.0
    for name, labels, value in prometheus_samples(text, "istio_agent_"):
        if name == "istio_agent_cert_expiry_timestamp_seconds" and labels.get("resource_name") == "default":
            expiry = value
        elif name == "istio_agent_cert_rotations_total" and labels.get("resource_name") == "default":
            rotations = value
        elif name == "istio_agent_certificates_issued_total":
            issued = value
        elif name == "istio_agent_xds_pushes_total":
            kind = labels.get("type", "")
            pushes[kind] = pushes.get(kind, 0.0) + value
        elif name == "istio_agent_xds_nacks_total":
            kind = labels.get("type", "")
            nacks[kind] = nacks.get(kind, 0.0) + value
        elif name == "istio_agent_dns_queries_total" and labels.get("outcome") in dns:
            dns[labels["outcome"]] += value
        elif name in _UPSTREAM_DNS:
            upstream_dns[_UPSTREAM_DNS[name]] += value
        elif name == "istio_agent_wasm_cache_entries":
            wasm_modules = value
        elif name == "istio_agent_wasm_remote_fetch_count" and labels.get("result") != "success":
            wasm_failures += value
    if not any(dns.values()) and upstream_dns["all"]:  # upstream's Go agent: answered = all - forwarded
        dns = {"local": max(0.0, upstream_dns["all"] - upstream_dns["forwarded"]),
               "forwarded": upstream_dns["forwarded"], "failed": upstream_dns["failed"]}
    return AgentStats(expiry, rotations, issued, pushes, nacks, dns["local"], dns["forwarded"], dns["failed"],
                      wasm_modules, wasm_failures)


def increase(before: float, after: float) -> float:
    """How much a counter grew; a counter that went down restarted (a new Envoy) from 0."""
    return after - before if after >= before else after


def rate(before: float, after: float, seconds: float) -> float:
    """Per-second increase of a counter over `seconds` (0 when no time passed)."""
    return increase(before, after) / seconds if seconds > 0 else 0.0


def histogram_delta(before: Histogram | None, after: Histogram | None) -> Histogram | None:
    """The observations made between two snapshots of one histogram (the later one alone after a reset)."""
    if after is None:
        return None
    if before is None or before.bounds != after.bounds or after.total < before.total:
        return after
    return Histogram(after.bounds, tuple(a - b for a, b in zip(after.counts, before.counts, strict=True)))


def merge_histograms(histograms: Iterable[Histogram]) -> Histogram | None:
    """The sum of histograms with the same bounds (others are left out); None when there are none."""
    merged: Histogram | None = None
    for h in histograms:
        if merged is None:
            merged = h
        elif h.bounds == merged.bounds:
            merged = Histogram(merged.bounds, tuple(a + b for a, b in zip(merged.counts, h.counts, strict=True)))
    return merged


def quantile(q: float, histogram: Histogram | None) -> float | None:
    """The q-quantile (0..1) of cumulative buckets, interpolated linearly inside its bucket; None if empty.

    Values past the last finite bound are reported as that bound (there is nothing to interpolate to).
    """
    if histogram is None or histogram.total <= 0:
        return None
    rank = q * histogram.total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in zip(histogram.bounds, histogram.counts, strict=True):
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def cumulative(bounds: Sequence[float], observations: Iterable[float]) -> Histogram:
    """Cumulative buckets of `observations` (for tests and fixtures)."""
    values = sorted(observations)
    counts = tuple(float(sum(1 for v in values if v <= b)) for b in bounds)
    return Histogram(tuple(bounds), counts)
