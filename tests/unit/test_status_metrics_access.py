"""METRICS_LOCALHOST_ACCESS_ONLY: the merged scrape refuses callers that are not on this host."""

from __future__ import annotations

from unittest import mock

from aiohttp.test_utils import make_mocked_request
from prometheus_client import CollectorRegistry

from istio_agent.status.metrics_handler import MergedMetricsHandler
from istio_agent.status.metrics_merge import MetricsOptions


def request_from(address: str):  # type: ignore[no-untyped-def]
    transport = mock.Mock()
    transport.get_extra_info.side_effect = (
        lambda name, default=None: (address, 40000) if name == "peername" else default)
    return make_mocked_request("GET", "/stats/prometheus", transport=transport)


async def test_other_callers_get_403_when_localhost_only() -> None:
    handler = MergedMetricsHandler(MetricsOptions(envoy_port=None, localhost_only=True), CollectorRegistry())
    response = await handler.handle(request_from("10.244.0.9"))
    assert response.status == 403
    assert "localhost" in response.text  # type: ignore[attr-defined]
    await handler.close()
