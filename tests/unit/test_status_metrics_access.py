"""METRICS_LOCALHOST_ACCESS_ONLY: the merged scrape refuses callers that are not on this host."""

from __future__ import annotations

from istio_agent.httpio.server_core import Request
from istio_agent.metrics import CollectorRegistry
from istio_agent.status.merged_metrics.handler import MergedMetricsHandler
from istio_agent.status.merged_metrics.merge import MetricsOptions


def request_from(address: str) -> Request:
    return Request("GET", "/stats/prometheus", "/stats/prometheus", "", (("Host", "x"),), address)


async def test_other_callers_get_403_when_localhost_only() -> None:
    handler = MergedMetricsHandler(MetricsOptions(envoy_port=None, localhost_only=True), CollectorRegistry())
    response = await handler.handle(request_from("10.244.0.9"))
    assert response.status == 403
    assert b"localhost" in response.body
    await handler.close()
