"""pkg/wasm's metrics, on the agent's registry, named as the agent exports them upstream (`istio_agent_wasm_*`).

Upstream's sums are exported without a `_total` suffix (its exporter is set so), and dashboards and tests
query them by those names (`istio_agent_wasm_remote_fetch_count{result="download_failure"}`): they are
`Sum`s here, written under the same names and type (`counter`) as upstream writes them.
"""

from __future__ import annotations

from collections.abc import Iterator

from istio_agent.metrics import CollectorRegistry, Gauge, Histogram, Metric, Sum

# wasm_remote_fetch_count results (upstream's)
FETCH_SUCCESS = "success"
DOWNLOAD_FAILURE = "download_failure"
MANIFEST_FAILURE = "manifest_failure"
CHECKSUM_MISMATCHED = "checksum_mismatched"
FETCH_FAILURE = "fetch_failure"
CONVERSION_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class _Sum:
    """A sum by one label, its series sorted by label value."""

    def __init__(self, name: str, documentation: str, label: str) -> None:
        self._sum = Sum(name, documentation, [label])
        self.name, self.label = name, label

    def inc(self, value: str, amount: float = 1) -> None:
        self._sum.labels(value).inc(amount)

    def get(self, value: str) -> float:
        """The count for `value` (0 when never counted; reading makes no series)."""
        for metric in self._sum.collect():
            for sample in metric.samples:
                if sample.labels.get(self.label) == value:
                    return sample.value
        return 0.0

    def collect(self) -> Iterator[Metric]:
        for metric in self._sum.collect():
            metric.samples.sort(key=lambda sample: sorted(sample.labels.items()))
            yield metric


class WasmMetrics:
    """The five families of upstream's pkg/wasm/monitoring.go."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.cache_entries = Gauge("istio_agent_wasm_cache_entries", "number of Wasm remote fetch cache entries.",
                                   registry=registry)
        self.cache_lookups = _Sum("istio_agent_wasm_cache_lookup_count",
                                  "number of Wasm remote fetch cache lookups.", "hit")
        self.remote_fetches = _Sum(
            "istio_agent_wasm_remote_fetch_count",
            "number of Wasm remote fetches and results, including success, download failure, and checksum mismatch.",
            "result")
        self.conversions = _Sum(
            "istio_agent_wasm_config_conversion_count",
            "number of Wasm config conversions and results, including success, no remote load, marshal failure, "
            "remote fetch failure, miss remote fetch hint.", "result")
        self.conversion_duration = Histogram(
            "istio_agent_wasm_config_conversion_duration",
            "Total time in milliseconds istio-agent spends on converting remote load in Wasm config.",
            buckets=CONVERSION_BUCKETS, registry=registry)
        if registry is not None:
            for family in (self.cache_lookups, self.remote_fetches, self.conversions):
                registry.register(family)
