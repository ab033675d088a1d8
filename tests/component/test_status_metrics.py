"""The merged `/stats/prometheus` endpoint against real HTTP peers on loopback.

Envoy is played by a loopback server serving an Envoy-shaped page (the real Envoy is in
test_status_metrics_envoy.py); the application is prometheus_client's own exposition server
(it answers OpenMetrics when asked) or a misbehaving server. Every body is checked with
`promtool check metrics` and prometheus_client's parsers.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator

import aiohttp
import pytest
from support import free_port
from test_status_metrics_peers import (
    OM_TYPE,
    PROMETHEUS_ACCEPT,
    TEXT_ACCEPT,
    Peer,
    assert_promtool_parses,
    envoy_page,
    merged_endpoint,
    names,
    parse,
    prometheus_client_app,
)

from istio_agent.metrics import generate_latest
from istio_agent.status.merged_metrics.handler import MergedMetricsHandler, MetricsOptions
from istio_agent.status.merged_metrics.merge import MAX_SOURCE_BYTES, ScrapeTarget

FAILURES = "istio_agent_scrape_failures_total"


@pytest.fixture
async def peer() -> AsyncIterator[Peer]:
    p = Peer(envoy_page())
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


async def scrape(port: int, accept: str = PROMETHEUS_ACCEPT, path: str = "/stats/prometheus",
                 timeout: str | None = None, encoding: str = "identity") -> tuple[int, str, bytes, dict[str, str]]:
    headers = {"Accept": accept, "Accept-Encoding": encoding}
    if timeout is not None:
        headers["X-Prometheus-Scrape-Timeout-Seconds"] = timeout
    async with aiohttp.ClientSession(auto_decompress=False) as session, session.get(
            f"http://127.0.0.1:{port}{path}", headers=headers) as response:
        body = await response.read()
        return response.status, response.headers.get("Content-Type", ""), body, dict(response.headers)


def failures(handler: MergedMetricsHandler, kind: str) -> float:
    """The failure counter as the agent's registry holds it after the scrapes so far."""
    samples = parse(generate_latest(handler.registry), "text/plain")
    return samples[(FAILURES, (("type", kind),))]


def first(body: bytes, prefix: bytes) -> int:
    at = body.find(b"\n" + prefix)
    assert at >= 0, f"no {prefix!r} in the body"
    return at


async def test_text_scrape_merges_agent_then_envoy_then_app(peer: Peer) -> None:
    with prometheus_client_app() as app_port:
        options = MetricsOptions(envoy_port=peer.port, app_targets=(ScrapeTarget(app_port),))
        async with merged_endpoint(options) as (port, _):
            status, ctype, body, _ = await scrape(port, TEXT_ACCEPT, path="/stats/prometheus?usedonly")
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
    assert_promtool_parses(body)
    samples = parse(body, ctype)
    assert samples[("envoy_cluster_upstream_cx_total", (("envoy_cluster_name", "outbound|80||svc-3.default.svc"
                                                         ".cluster.local"),))] == 3
    assert samples[("app_requests_total", (("code", "200"),))] == 3
    assert samples[("istio_agent_scrapes_total", ())] == 1
    assert body.startswith(b"# HELP istio_agent_") and first(body, b"# TYPE envoy_") < first(body, b"# HELP app_")
    assert b"# EOF" not in body
    assert peer.queries == ["usedonly"]  # the scraper's query string goes to Envoy, as upstream


async def test_openmetrics_scrape_has_one_eof_and_parses_strictly(peer: Peer) -> None:
    with prometheus_client_app() as app_port:
        options = MetricsOptions(envoy_port=peer.port, app_targets=(ScrapeTarget(app_port),))
        async with merged_endpoint(options) as (port, _):
            status, ctype, body, _ = await scrape(port, PROMETHEUS_ACCEPT, path="/metrics")
    assert status == 200 and ctype == "application/openmetrics-text; version=1.0.0; charset=utf-8"
    assert body.count(b"# EOF") == 1 and body.endswith(b"\n# EOF\n")
    assert_promtool_parses(body)
    samples = parse(body, ctype)  # prometheus_client's strict OpenMetrics parser
    assert {"istio_agent_scrapes_total", "envoy_cluster_upstream_cx_total", "envoy_cluster_assignment_stale",
            "envoy_cluster_upstream_cx_connect_ms_bucket", "app_requests_total", "app_latency_seconds_bucket"} <= (
        names(samples))


async def test_text_sources_are_served_as_text_even_to_an_openmetrics_scraper(peer: Peer) -> None:
    options = MetricsOptions(envoy_port=peer.port, app_targets=(ScrapeTarget(peer.port, "/text"),))
    async with merged_endpoint(options) as (port, _):
        _, ctype, body, _ = await scrape(port, PROMETHEUS_ACCEPT)
    assert ctype.startswith("text/plain; version=0.0.4") and b"# EOF" not in body
    assert {"second_app_up", "envoy_server_live"} <= names(parse(body, ctype))


async def test_mixed_app_targets_become_one_openmetrics_page(peer: Peer) -> None:
    with prometheus_client_app() as app_port:
        options = MetricsOptions(envoy_port=peer.port, app_targets=(
            ScrapeTarget(peer.port, "/text"), ScrapeTarget(app_port)))
        async with merged_endpoint(options) as (port, _):
            _, ctype, body, _ = await scrape(port, PROMETHEUS_ACCEPT)
    assert ctype.startswith(OM_TYPE)
    assert_promtool_parses(body)
    assert {"second_app_up", "app_requests_total", "envoy_server_live"} <= names(parse(body, ctype))


async def test_a_source_that_changes_format_is_converted(peer: Peer) -> None:
    """After the first scrape the answer's format is fixed before the sources answer (from their last
    Content-Types); an app that then answers in the other format is converted, either way."""
    options = MetricsOptions(envoy_port=peer.port, app_targets=(ScrapeTarget(peer.port, "/flip"),))
    async with merged_endpoint(options) as (port, handler):
        types = []
        for _ in range(4):
            status, ctype, body, _ = await scrape(port, PROMETHEUS_ACCEPT)
            assert status == 200
            assert_promtool_parses(body)
            samples = parse(body, ctype)  # strict OpenMetrics or text, as announced
            assert samples[("flip_events_total", ())] == 4 and "envoy_server_live" in names(samples)
            types.append(ctype.split(";")[0])
        assert failures(handler, "application") == 0
    assert types == [OM_TYPE, OM_TYPE, "text/plain", OM_TYPE]


async def test_app_down_keeps_the_others_and_is_counted(peer: Peer) -> None:
    options = MetricsOptions(envoy_port=peer.port, app_targets=(ScrapeTarget(free_port()),))
    async with merged_endpoint(options) as (port, handler):
        for _ in range(2):
            status, ctype, body, _ = await scrape(port)
            assert status == 200
            assert {"envoy_server_live", "istio_agent_scrapes_total"} <= names(parse(body, ctype))
        assert failures(handler, "application") == 2 and failures(handler, "envoy") == 0


@pytest.mark.parametrize("path", ["/500", "/html", "/json", "/protobuf"])
async def test_app_errors_never_reach_the_body(peer: Peer, path: str) -> None:
    with prometheus_client_app() as app_port:
        options = MetricsOptions(envoy_port=peer.port, app_targets=(
            ScrapeTarget(peer.port, path), ScrapeTarget(app_port)))
        async with merged_endpoint(options) as (port, handler):
            for accept in (TEXT_ACCEPT, PROMETHEUS_ACCEPT):
                status, ctype, body, _ = await scrape(port, accept)
                assert status == 200
                assert b"SECRET-STACK-TRACE" not in body and b"boom" not in body
                assert_promtool_parses(body)
                samples = parse(body, ctype)
                assert {"envoy_server_live", "app_requests_total"} <= names(samples)
            assert failures(handler, "application") == 2


@pytest.mark.parametrize("hanging", ["envoy", "app"])
async def test_a_source_without_headers_is_dropped_at_the_scrape_deadline(peer: Peer, hanging: str) -> None:
    with prometheus_client_app() as app_port:
        targets: tuple[ScrapeTarget, ...]
        if hanging == "envoy":
            peer.envoy_mode = "hang"
            targets = (ScrapeTarget(app_port),)
        else:
            targets = (ScrapeTarget(peer.port, "/hang"), ScrapeTarget(app_port))
        async with merged_endpoint(MetricsOptions(envoy_port=peer.port, app_targets=targets)) as (port, handler):
            status, ctype, body, _ = await scrape(port, timeout="1")
            assert status == 200
            samples = parse(body, ctype)
            assert "app_requests_total" in names(samples)
            assert ("envoy_server_live" in names(samples)) == (hanging == "app")
            assert failures(handler, "envoy" if hanging == "envoy" else "application") == 1


async def test_a_body_that_stalls_costs_only_its_share(peer: Peer) -> None:
    """The stalled app is cut at its last whole family; the target after it is still served."""
    targets = (ScrapeTarget(peer.port, "/stall"), ScrapeTarget(peer.port, "/text"))
    async with merged_endpoint(MetricsOptions(envoy_port=peer.port, app_targets=targets)) as (port, handler):
        status, ctype, body, _ = await scrape(port, TEXT_ACCEPT, timeout="1")
        assert status == 200
        assert_promtool_parses(body)
        samples = parse(body, ctype)
        assert {"envoy_server_live", "stalled_first", "second_app_up"} <= names(samples)
        assert b"stalled_second" not in body  # its TYPE line had arrived, its samples had not
        assert failures(handler, "application") == 1


@pytest.mark.parametrize("mode", ["huge", "declared"])
async def test_each_source_is_capped_at_10_mib(peer: Peer, mode: str) -> None:
    peer.envoy_mode = mode
    targets = (ScrapeTarget(peer.port, "/text"),)
    async with merged_endpoint(MetricsOptions(envoy_port=peer.port, app_targets=targets)) as (port, handler):
        status, _, body, _ = await scrape(port, TEXT_ACCEPT)
        assert status == 200
        assert len(body) <= MAX_SOURCE_BYTES + 64 * 1024
        assert_promtool_parses(body)
        assert body.endswith(b"# TYPE second_app_up gauge\nsecond_app_up 1\n")
        if mode == "declared":
            assert b"huge_series" not in body  # refused on its Content-Length, before any byte
        else:
            assert b"huge_series" in body  # streamed up to the cap, cut at a family boundary
        assert failures(handler, "envoy") == 1


async def test_app_over_the_cap_does_not_cost_envoy(peer: Peer) -> None:
    targets = (ScrapeTarget(peer.port, "/huge"),)
    async with merged_endpoint(MetricsOptions(envoy_port=peer.port, app_targets=targets)) as (port, handler):
        _, ctype, body, _ = await scrape(port, TEXT_ACCEPT)
        assert_promtool_parses(body)
        assert "envoy_server_live" in names(parse(body, ctype))
        assert b"huge_series_000001" in body and len(body) <= MAX_SOURCE_BYTES + 256 * 1024
        assert failures(handler, "application") == 1


async def test_gzip_when_the_scraper_asks(peer: Peer) -> None:
    with prometheus_client_app() as app_port:
        options = MetricsOptions(envoy_port=peer.port, app_targets=(ScrapeTarget(app_port),))
        async with merged_endpoint(options) as (port, _):
            _, ctype, raw, headers = await scrape(port, PROMETHEUS_ACCEPT, encoding="gzip")
            _, _, _, plain_headers = await scrape(port, PROMETHEUS_ACCEPT)
    assert headers.get("Content-Encoding") == "gzip" and "Content-Encoding" not in plain_headers
    body = gzip.decompress(raw)
    assert len(raw) < len(body) and body.endswith(b"# EOF\n")
    assert {"envoy_server_live", "app_requests_total"} <= names(parse(body, ctype))


async def test_concurrent_scrapes(peer: Peer) -> None:
    with prometheus_client_app() as app_port:
        options = MetricsOptions(envoy_port=peer.port, app_targets=(ScrapeTarget(app_port),))
        async with merged_endpoint(options) as (port, _):
            results = await asyncio.gather(*(scrape(port, accept) for accept in [PROMETHEUS_ACCEPT, TEXT_ACCEPT] * 4))
    for status, ctype, body, _ in results:
        assert status == 200
        assert {"envoy_server_live", "app_requests_total"} <= names(parse(body, ctype))
