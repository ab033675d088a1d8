"""The merged-metrics rules without sockets: targets, negotiation, budget, per-source filtering.

Expositions come from prometheus_client's real encoders and are checked with its real text
and OpenMetrics parsers (the strict one: it rejects a misplaced `# EOF`, blank lines, counter
samples without `_total` ...).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary
from prometheus_client.exposition import generate_latest as text_latest
from prometheus_client.openmetrics.exposition import generate_latest as om_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

from istio_agent import metrics as agent_metrics
from istio_agent.config.errors import ConfigError
from istio_agent.status.merged_metrics.filter import (
    MalformedSource,
    SourceFilter,
    SourceTooLarge,
    openmetrics_to_text,
    text_to_openmetrics,
)
from istio_agent.status.merged_metrics.merge import (
    EOF_LINE,
    RESERVED_PORTS,
    TEXT_CONTENT_TYPE,
    TEXT_OUTPUT,
    Format,
    OutputFormat,
    ScrapeTarget,
    accepted_openmetrics,
    accepts_gzip,
    agent_exposition,
    output_format,
    parse_scrape_annotations,
    scrape_budget,
    source_accept_header,
    source_format,
)

OM = OutputFormat(Format.OPENMETRICS, "1.0.0")
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
ENVOY_PAGE = b"""# TYPE envoy_cluster_upstream_cx_total counter
envoy_cluster_upstream_cx_total{envoy_cluster_name="outbound|80||a.default.svc.cluster.local"} 7
envoy_cluster_upstream_cx_total{envoy_cluster_name="xds-grpc"} 1
# TYPE envoy_cluster_assignment_stale counter
envoy_cluster_assignment_stale{envoy_cluster_name="xds-grpc"} 0
# TYPE envoy_cluster_upstream_rq counter
envoy_cluster_upstream_rq{envoy_response_code="200",envoy_cluster_name="xds-grpc"} 4
# TYPE envoy_cluster_upstream_rq_total counter
envoy_cluster_upstream_rq_total{envoy_cluster_name="xds-grpc"} 4
# TYPE envoy_server_live gauge
envoy_server_live{} 1
# TYPE envoy_server_initialization_time_ms histogram
envoy_server_initialization_time_ms_bucket{le="0.5"} 0
envoy_server_initialization_time_ms_bucket{le="1"} 1
envoy_server_initialization_time_ms_bucket{le="+Inf"} 1
envoy_server_initialization_time_ms_sum{} 0.8
envoy_server_initialization_time_ms_count{} 1
"""


def app_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("app_requests", "Requests served.", ["code"], registry=registry).labels("200").inc(3)
    Gauge("app_inflight", 'In flight "now".', registry=registry).set(2)
    Histogram("app_latency_seconds", "Latency.", registry=registry).observe(0.2)
    Summary("app_size_bytes", "Size.", registry=registry).observe(10)
    return registry


def run_filter(data: bytes, source: Format, output: OutputFormat, chunk: int = 0, **kw: int) -> bytes:
    filt = SourceFilter(source, output, **kw)
    step = chunk or max(len(data), 1)
    parts = [filt.feed(data[i:i + step]) for i in range(0, len(data), step)]
    return b"".join(parts) + filt.finish()


def samples_text(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parse_text(body.decode()) for s in family.samples}


def samples_om(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parse_om(body.decode()) for s in family.samples}


# --- targets ---------------------------------------------------------------------------------------------------


def test_annotations_unset_or_disabled_scrape_nothing() -> None:
    assert parse_scrape_annotations("") == ()
    assert parse_scrape_annotations('{"scrape": "false", "port": "9090"}') == ()


def test_annotations_defaults_are_port_80_and_metrics() -> None:
    assert parse_scrape_annotations('{"scrape": "true"}') == (ScrapeTarget(80, "/metrics"),)
    assert parse_scrape_annotations('{"scrape":"true","path":"stats","port":"9090"}') == (ScrapeTarget(9090, "/stats"),)
    assert parse_scrape_annotations('{"port": 8080}') == (ScrapeTarget(8080, "/metrics"),)


def test_annotations_targets_list() -> None:
    raw = '{"scrape":"true","targets":[{"port":"9090","path":"/a"},{"port":9091}]}'
    assert parse_scrape_annotations(raw) == (ScrapeTarget(9090, "/a"), ScrapeTarget(9091, "/metrics"))


@pytest.mark.parametrize("port", sorted(RESERVED_PORTS))
def test_reserved_ports_are_refused_naming_the_reason(port: int) -> None:
    with pytest.raises(ConfigError, match=f"port {port} is reserved for Istio"):
        parse_scrape_annotations(f'{{"port": "{port}"}}', status_port=25020)
    with pytest.raises(ConfigError, match=r"targets\[1\]\.port"):
        parse_scrape_annotations(f'{{"targets": [{{"port": "9090"}}, {{"port": "{port}"}}]}}', status_port=25020)


def test_status_port_and_leading_zero_spellings_are_refused() -> None:
    with pytest.raises(ConfigError, match="status port"):
        parse_scrape_annotations('{"port": "16020"}', status_port=16020)
    with pytest.raises(ConfigError, match="reserved"):
        parse_scrape_annotations('{"port": "015090"}')


@pytest.mark.parametrize("raw, field", [
    ("{", "not valid JSON"),
    ("[]", "JSON object"),
    ('{"port": "http"}', "port: invalid port"),
    ('{"port": "70000"}', "port: invalid port"),
    ('{"port": true}', "port: invalid port"),
    ('{"path": "/a b"}', "path: invalid path"),
    ('{"targets": "9090"}', "targets: must be a list"),
    ('{"targets": [9090]}', r"targets\[0\]"),
    ('{"targets": [{"path": "/m"}]}', r"targets\[0\]\.port"),
])
def test_bad_annotations_name_the_field(raw: str, field: str) -> None:
    with pytest.raises(ConfigError, match=f"ISTIO_PROMETHEUS_ANNOTATIONS: .*{field}"):
        parse_scrape_annotations(raw)


# --- negotiation -----------------------------------------------------------------------------------------------


def test_openmetrics_only_when_explicitly_accepted() -> None:
    assert accepted_openmetrics(PROMETHEUS_ACCEPT) == "1.0.0"
    assert accepted_openmetrics("application/openmetrics-text") == "1.0.0"
    assert accepted_openmetrics("application/openmetrics-text; version=0.0.1,text/plain;q=0.5") == "0.0.1"
    assert accepted_openmetrics("application/openmetrics-text;version=1.0.0;q=0,text/plain") == ""
    assert accepted_openmetrics("text/plain;version=0.0.4") == ""
    assert accepted_openmetrics("*/*") == ""
    assert accepted_openmetrics("") == ""


def test_sources_are_never_asked_for_protobuf() -> None:
    for version in ("1.0.0", "0.0.1", ""):
        assert "protobuf" not in source_accept_header(version)
    assert accepted_openmetrics(source_accept_header("1.0.0")) == "1.0.0"
    assert accepted_openmetrics(source_accept_header("")) == ""


def test_source_formats() -> None:
    assert source_format("application/openmetrics-text; version=1.0.0; charset=utf-8") is Format.OPENMETRICS
    assert source_format("text/plain; charset=UTF-8") is Format.TEXT  # Envoy's
    assert source_format("") is Format.TEXT
    assert source_format("text/html") is Format.TEXT  # validation decides
    assert source_format(
        "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited") is None


def test_output_is_openmetrics_only_if_accepted_and_some_source_speaks_it() -> None:
    assert output_format("1.0.0", [Format.TEXT, Format.OPENMETRICS]) == OM
    assert output_format("1.0.0", [Format.TEXT]) == TEXT_OUTPUT
    assert output_format("", [Format.OPENMETRICS]) == TEXT_OUTPUT
    assert output_format("0.0.1", [Format.OPENMETRICS]).content_type == (
        "application/openmetrics-text; version=0.0.1; charset=utf-8")
    assert TEXT_OUTPUT.content_type == TEXT_CONTENT_TYPE


@pytest.mark.parametrize("header, budget", [
    (None, 9.5), ("10", 9.5), ("1", 0.9), ("2.5", 2.25), ("0.05", 0.045),
    ("soon", 9.5), ("-3", 9.5), ("0", 9.5), ("inf", 9.5), ("nan", 9.5),
])
def test_budget_is_the_scrape_timeout_minus_a_margin(header: str | None, budget: float) -> None:
    assert math.isclose(scrape_budget(header), budget)


def test_gzip_only_when_asked() -> None:
    assert accepts_gzip("gzip")
    assert accepts_gzip("deflate, gzip;q=0.5")
    assert not accepts_gzip("gzip;q=0, identity")
    assert not accepts_gzip("")


# --- the agent's registry --------------------------------------------------------------------------------------


def agent_registry() -> agent_metrics.CollectorRegistry:
    """The app's metrics again, on the agent's own registry (what agent_exposition renders)."""
    registry = agent_metrics.CollectorRegistry()
    agent_metrics.Counter("app_requests", "Requests served.", ["code"], registry=registry).labels("200").inc(3)
    agent_metrics.Gauge("app_inflight", 'In flight "now".', registry=registry).set(2)
    agent_metrics.Histogram("app_latency_seconds", "Latency.", registry=registry).observe(0.2)
    return registry


def test_agent_exposition_in_both_formats_without_eof() -> None:
    registry = agent_registry()
    text = agent_exposition(registry, TEXT_OUTPUT)
    assert samples_text(text)[("app_requests_total", (("code", "200"),))] == 3
    om = agent_exposition(registry, OM)
    assert EOF_LINE not in om
    assert samples_om(om + EOF_LINE)[("app_requests_total", (("code", "200"),))] == 3


# --- SourceFilter ----------------------------------------------------------------------------------------------


def test_text_to_text_is_byte_identical() -> None:
    body = text_latest(app_registry()) + ENVOY_PAGE
    assert run_filter(body, Format.TEXT, TEXT_OUTPUT) == body
    assert run_filter(body, Format.TEXT, TEXT_OUTPUT, chunk=7) == body


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=12), om=st.booleans())
def test_chunking_never_changes_the_output(cuts: list[int], om: bool) -> None:
    body = (om_latest if om else text_latest)(app_registry())
    source = Format.OPENMETRICS if om else Format.TEXT
    output = OM if om else TEXT_OUTPUT
    whole = run_filter(body, source, output)
    filt = SourceFilter(source, output, hold_limit=64)
    points = sorted({min(c, len(body)) for c in cuts})
    parts, last = [], 0
    for point in [*points, len(body)]:
        parts.append(filt.feed(body[last:point]))
        last = point
    assert b"".join(parts) + filt.finish() == whole


def test_openmetrics_eof_is_stripped_and_anything_after_it_ignored() -> None:
    body = om_latest(app_registry())
    out = run_filter(body + b"trailing garbage\n", Format.OPENMETRICS, OM)
    assert EOF_LINE not in out
    assert samples_om(out + EOF_LINE) == samples_om(body)


def test_openmetrics_without_eof_is_a_truncated_source() -> None:
    body = om_latest(app_registry()).replace(EOF_LINE, b"")
    filt = SourceFilter(Format.OPENMETRICS, OM)
    emitted = filt.feed(body)
    with pytest.raises(MalformedSource, match="EOF"):
        filt.finish()
    samples_om(emitted + EOF_LINE)  # what was emitted before is still whole families


def test_text_becomes_strict_openmetrics() -> None:
    body = text_latest(app_registry()) + ENVOY_PAGE + b"\n# a free comment\nloose_sample 4\n"
    out = run_filter(body, Format.TEXT, OM, chunk=50)
    families = {f.name: f for f in parse_om((out + EOF_LINE).decode())}
    assert families["envoy_cluster_upstream_cx"].type == "counter"
    assert families["envoy_cluster_assignment_stale"].type == "unknown"  # a counter without _total
    # Envoy has both `upstream_rq` and `upstream_rq_total`: the second cannot become family `upstream_rq`.
    assert families["envoy_cluster_upstream_rq"].type == "unknown"
    assert families["envoy_cluster_upstream_rq_total"].type == "unknown"
    assert families["envoy_server_initialization_time_ms"].type == "histogram"
    assert families["app_requests"].type == "counter"
    assert families["app_inflight"].documentation == 'In flight "now".'
    assert samples_om(out + EOF_LINE)[("envoy_cluster_upstream_cx_total", (("envoy_cluster_name", "xds-grpc"),))] == 1
    assert samples_om(out + EOF_LINE)[("loose_sample", ())] == 4
    assert b"unknown" not in out  # text parsers (promtool's) cannot read that type


def test_openmetrics_becomes_text() -> None:
    body = (b"# HELP jobs Jobs done.\n# TYPE jobs counter\n# UNIT jobs jobs\n"
            b'jobs_total{queue="a b"} 5 1700000000.5 # {trace_id="abc"} 1.0 1700000000.0\n'
            b"jobs_created 1700000000.0\n"
            b"# TYPE build info\nbuild_info{version=\"1.2\"} 1\n"
            b"# TYPE thing unknown\nthing 3 1700000001\n# EOF\n")
    out = run_filter(body, Format.OPENMETRICS, TEXT_OUTPUT)
    assert b"# EOF" not in out and b"# UNIT" not in out and b"trace_id" not in out
    assert b"# TYPE jobs_total counter\n" in out and b"# TYPE build_info gauge\n" in out
    assert b"# TYPE thing untyped\n" in out
    families = {f.name: f for f in parse_text(out.decode())}
    assert families["jobs"].type == "counter"
    [sample] = [s for s in families["jobs"].samples if s.name == "jobs_total"]
    assert sample.value == 5 and sample.labels == {"queue": "a b"}
    assert sample.timestamp is not None and float(sample.timestamp) == pytest.approx(1700000000.5)
    assert b'jobs_total{queue="a b"} 5 1700000000500\n' in out


@pytest.mark.parametrize("garbage", [
    b"<html><body>502 Bad Gateway</body></html>\n",
    b'{"error": "nope"}\n',
    b"Internal Server Error\n",
    b"metric_without_value\n",
    b"metric{a=\"b\"} twelve\n",
    b"\x00\x01\x02\xff\xfe binary\n",
    "caf\u00e9 1\n".encode("latin-1"),
])
@pytest.mark.parametrize("source", [Format.TEXT, Format.OPENMETRICS])
def test_garbage_stops_the_source_and_never_reaches_the_output(garbage: bytes, source: Format) -> None:
    good = text_latest(app_registry()) if source is Format.TEXT else om_latest(app_registry()).replace(EOF_LINE, b"")
    filt = SourceFilter(source, TEXT_OUTPUT if source is Format.TEXT else OM)
    emitted = filt.feed(good)
    with pytest.raises(MalformedSource):
        emitted += filt.feed(garbage + b"# TYPE later gauge\nlater 1\n")
        emitted += filt.finish()
    assert garbage.strip() not in emitted
    assert b"later" not in emitted
    parsed = samples_text(emitted) if source is Format.TEXT else samples_om(emitted + EOF_LINE)
    assert parsed  # whole families from before the garbage


def test_cut_short_source_leaves_only_whole_families() -> None:
    filt = SourceFilter(Format.TEXT, OM)
    out = filt.feed(ENVOY_PAGE[: ENVOY_PAGE.index(b"envoy_server_initialization_time_ms_bucket{le=\"1\"}")])
    # The histogram has started but is not complete: nothing of it is out yet.
    assert b"initialization" not in out
    assert b"envoy_server_live" in out
    parse_om((out + EOF_LINE).decode())


def test_size_cap() -> None:
    filt = SourceFilter(Format.TEXT, TEXT_OUTPUT, cap=len(ENVOY_PAGE) * 2)
    filt.feed(ENVOY_PAGE)
    filt.feed(ENVOY_PAGE)
    with pytest.raises(SourceTooLarge):
        filt.feed(b"x 1\n")


def test_a_family_larger_than_the_hold_limit_is_emitted_by_lines() -> None:
    big = b"# TYPE big gauge\n" + b"".join(b'big{i="%d"} %d\n' % (i, i) for i in range(2000))
    filt = SourceFilter(Format.TEXT, TEXT_OUTPUT, hold_limit=4096)
    out = filt.feed(big)
    assert out and out.endswith(b"\n") and len(out) > len(big) - 4096
    assert out + filt.finish() == big


def test_conversions_leave_sample_lines_alone() -> None:
    assert text_to_openmetrics(b"a_total 1\n") == b"a_total 1\n"
    assert openmetrics_to_text(b"a 1\n") == b"a 1\n"


def test_merged_openmetrics_document_has_one_eof_at_the_end() -> None:
    """Agent + Envoy (text) + two OpenMetrics apps, as the handler writes them."""
    agent = agent_metrics.CollectorRegistry()
    agent_metrics.Counter("istio_agent_scrapes", "Scrapes.", registry=agent).inc()
    second = CollectorRegistry()
    Gauge("other_app_up", "Up.", registry=second).set(1)
    body = agent_exposition(agent, OM)
    body += run_filter(ENVOY_PAGE, Format.TEXT, OM, chunk=64)
    body += run_filter(om_latest(app_registry()), Format.OPENMETRICS, OM, chunk=64)
    body += run_filter(om_latest(second), Format.OPENMETRICS, OM)
    body += EOF_LINE
    assert body.count(b"# EOF") == 1 and body.endswith(EOF_LINE)
    names = {f.name for f in parse_om(body.decode())}
    assert {"istio_agent_scrapes", "envoy_cluster_upstream_cx", "app_requests", "other_app_up"} <= names
