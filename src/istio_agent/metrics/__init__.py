"""The agent's own Prometheus metrics: registry, counter, gauge, histogram, custom families, process metrics.

Why not prometheus_client (the well-kept library, which the tests use as the
peer this package must match byte for byte): one agent runs beside every pod,
so each MB of its anonymous memory is paid once per pod. Importing prometheus_client after the
floor's imports costs ~3.0 MB of anonymous memory (+3.3 MB RSS), ~2.2 MB of it
for the http.server / socketserver / urllib.request / wsgiref chain its
exposition module loads for servers and push gateways the agent never uses,
and ~0.8 MB for its own modules. With the agent's other modules loaded too it
is 2.6 MB anonymous (bench_memory's import budget); in a running agent at idle
it measured 0.8-0.9 MB anonymous and 0.9 MB RSS, sidecar and proxyless alike
(three paired bench_memory runs; where the rest of the import-time difference
goes once the components start is not explained). The agent uses a small part
of prometheus_client: labelled counters, gauges and histograms, collectors
yielding families, the process collector and the two text renderings, which is
what this package is, in the same shapes (so a collector reads the same in both).

`core`: families, samples, the registry, `go_float`; `instruments`: Counter,
Gauge, Histogram, and Sum (a counter under its own name, as upstream's Go agent
writes its sums: prometheus_client has no such thing); `process`: ProcessCollector; `exposition`: text 0.0.4 and
OpenMetrics 1.0.0. The parity tests (tests/unit/test_metrics_parity.py) build
the same metrics in both and compare the rendered bytes. install-cni and its
repair controller count on it too: the product has one metrics stack.
"""

from istio_agent.metrics.core import (
    CollectorRegistry,
    CounterMetricFamily,
    DuplicateTimeseries,
    GaugeMetricFamily,
    Metric,
    Sample,
    SumMetricFamily,
    go_float,
)
from istio_agent.metrics.exposition import (
    TEXT_CONTENT_TYPE,
    generate_latest,
    generate_openmetrics,
)
from istio_agent.metrics.instruments import Counter, Gauge, Histogram, Sum
from istio_agent.metrics.process import ProcessCollector

__all__ = [
    "TEXT_CONTENT_TYPE",
    "CollectorRegistry",
    "Counter",
    "CounterMetricFamily",
    "DuplicateTimeseries",
    "Gauge",
    "GaugeMetricFamily",
    "Histogram",
    "Metric",
    "ProcessCollector",
    "Sample",
    "Sum",
    "SumMetricFamily",
    "generate_latest",
    "generate_openmetrics",
    "go_float",
]
