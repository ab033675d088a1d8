"""The merged endpoint with the real Envoy's stats listener and a real Prometheus server scraping it.

Envoy runs with a static bootstrap whose loopback listener routes `/stats/prometheus` to its
admin API, like the 15090 listener of Istio's bootstrap. The app is prometheus_client's own
exposition server. Prometheus (Debian's `prometheus`) scrapes the merged endpoint with its
own Accept header, so it negotiates OpenMetrics exactly as in a cluster.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
from needs import need_tool
from support import eventually, free_port, stop_process
from test_status_metrics_peers import (
    OM_TYPE,
    PROMETHEUS_ACCEPT,
    TEXT_ACCEPT,
    assert_promtool_parses,
    merged_endpoint,
    names,
    parse,
    prometheus_client_app,
    real_envoy,
)

from istio_agent.metrics import generate_latest
from istio_agent.status.merged_metrics.handler import MetricsOptions
from istio_agent.status.merged_metrics.merge import ScrapeTarget


async def scrape(port: int, accept: str) -> tuple[str, bytes]:
    async with aiohttp.ClientSession() as session, session.get(
            f"http://127.0.0.1:{port}/stats/prometheus", headers={"Accept": accept}) as response:
        assert response.status == 200
        return response.headers["Content-Type"], await response.read()


async def test_real_envoy_and_app_in_both_formats_then_app_stopped() -> None:
    with real_envoy() as envoy_port:
        app = prometheus_client_app()
        app_port = app.__enter__()
        try:
            options = MetricsOptions(envoy_port=envoy_port, app_targets=(ScrapeTarget(app_port),))
            async with merged_endpoint(options) as (port, handler):
                for accept, expected in ((TEXT_ACCEPT, "text/plain"), (PROMETHEUS_ACCEPT, OM_TYPE)):
                    ctype, body = await scrape(port, accept)
                    assert ctype.startswith(expected)
                    assert_promtool_parses(body)
                    got = names(parse(body, ctype))
                    assert {"envoy_server_live", "envoy_cluster_upstream_cx_total", "app_requests_total",
                            "istio_agent_scrapes_total"} <= got
                    assert body.count(b"# EOF") == (1 if expected == OM_TYPE else 0)
                app.__exit__(None, None, None)
                app_port = 0
                for accept in (TEXT_ACCEPT, PROMETHEUS_ACCEPT):
                    ctype, body = await scrape(port, accept)
                    assert_promtool_parses(body)
                    got = names(parse(body, ctype))
                    assert "envoy_server_live" in got and "istio_agent_scrapes_total" in got
                    assert "app_requests_total" not in got
                registry = parse(generate_latest(handler.registry), "text/plain")
                assert registry[("istio_agent_scrape_failures_total", (("type", "application"),))] == 2
                assert registry[("istio_agent_scrape_failures_total", (("type", "envoy"),))] == 0
        finally:
            if app_port:
                app.__exit__(None, None, None)


@contextlib.contextmanager
def prometheus_server(tmp_path: Path, target_port: int) -> Iterator[int]:
    binary = need_tool("prometheus")
    web_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
        "scrape_configs:\n"
        "- job_name: merged\n"
        "  metrics_path: /stats/prometheus\n"
        f"  static_configs: [{{targets: ['127.0.0.1:{target_port}']}}]\n")
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{web_port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        yield web_port
    finally:
        stop_process(process, grace=15)
        log.close()


async def query(session: aiohttp.ClientSession, web_port: int, promql: str) -> list[dict[str, Any]]:
    try:
        async with session.get(f"http://127.0.0.1:{web_port}/api/v1/query", params={"query": promql}) as r:
            if r.status != 200:
                return []
            data = await r.json()
    except aiohttp.ClientError:
        return []
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


async def test_prometheus_scrapes_the_merged_endpoint(tmp_path: Path) -> None:
    with real_envoy() as envoy_port, prometheus_client_app() as app_port:
        options = MetricsOptions(envoy_port=envoy_port, app_targets=(ScrapeTarget(app_port),))
        async with merged_endpoint(options) as (port, _):
            with prometheus_server(tmp_path, port) as web_port:
                async with aiohttp.ClientSession() as session:
                    wanted = {
                        'up{job="merged"}': 1.0,
                        'app_requests_total{code="200"}': 3.0,
                        "envoy_server_live": 1.0,
                    }
                    seen: dict[str, float] = {}

                    async def ingested() -> bool:
                        for promql in wanted:
                            result = await query(session, web_port, promql)
                            if result:
                                seen[promql] = float(result[0]["value"][1])
                        return set(seen) == set(wanted)

                    await eventually(ingested, "Prometheus to ingest the merged page", 60,
                                     lambda: (tmp_path / "prometheus.log").read_text()[-2000:], interval=0.2)
                    assert seen == wanted
                    scrapes = await query(session, web_port, 'istio_agent_scrapes_total{job="merged"}')
                    assert scrapes and float(scrapes[0]["value"][1]) >= 1
                    samples = await query(session, web_port, 'scrape_samples_scraped{job="merged"}')
                    assert samples and float(samples[0]["value"][1]) > 500
