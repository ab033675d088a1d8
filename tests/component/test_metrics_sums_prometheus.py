"""Sums in an OpenMetrics page, read by Prometheus's own OpenMetrics parser (promtool's backfill).

Upstream's agent writes its sums under their own names (`x 3`, no `_total`), and so does ours
(`istio_agent.metrics.Sum`; in OpenMetrics without a TYPE line). What matters is the scraper:
promtool's `tsdb create-blocks-from openmetrics` runs Prometheus's parser, and `tsdb dump` lists the
series it stored, which must carry the names written.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from needs import need_tool

from istio_agent.metrics import CollectorRegistry, CounterMetricFamily, SumMetricFamily, generate_openmetrics

STAMP = 1_700_000_000.0  # backfill wants a timestamp on every sample


class Page:
    def collect(self) -> list[CounterMetricFamily | SumMetricFamily]:
        requests = SumMetricFamily("istio_agent_xds_proxy_requests", "The total number of Xds Proxy Requests")
        requests.add_metric((), 8, timestamp=STAMP)
        terminations = SumMetricFamily("istio_agent_envoy_connection_terminations",
                                       "The total number of connection errors from envoy", labels=["type"])
        terminations.add_metric(["cancelled"], 2, timestamp=STAMP)
        counter = CounterMetricFamily("istio_agent_ca_requests", "CSRs.", labels=["code"])
        counter.add_metric(["OK"], 1, timestamp=STAMP)
        return [requests, terminations, counter]


def test_prometheus_stores_the_sums_under_the_names_written(tmp_path: Path) -> None:
    promtool = need_tool("promtool")
    registry = CollectorRegistry()
    registry.register(Page())
    page = tmp_path / "page.om"
    page.write_bytes(generate_openmetrics(registry))
    blocks = tmp_path / "blocks"
    made = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(page), str(blocks)],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stdout + made.stderr
    (blocks / "wal").mkdir(exist_ok=True)  # dump reads a WAL too
    dumped = subprocess.run([promtool, "tsdb", "dump", str(blocks)], capture_output=True, text=True, timeout=60)
    assert dumped.returncode == 0, dumped.stderr
    assert sorted(dumped.stdout.splitlines()) == sorted([
        '{__name__="istio_agent_ca_requests_total", code="OK"} 1 1700000000000',
        '{__name__="istio_agent_envoy_connection_terminations", type="cancelled"} 2 1700000000000',
        '{__name__="istio_agent_xds_proxy_requests"} 8 1700000000000',
    ])
