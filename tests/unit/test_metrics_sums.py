"""Sums: counters written under their own name, as upstream's Go agent writes its sums on :15020.

prometheus_client has no such family (its counters always end in `_total`), so the peers here are
the bytes upstream's agent served (captured from a running Go pilot-agent: `# TYPE x counter`, then
`x{...} 1`, no `_created`), prometheus_client's text parser (which must read ours as it reads upstream's)
and its OpenMetrics parser (strict: the series under their own names, typed "unknown"). Prometheus's own
OpenMetrics parser is the peer of `tests/component/test_metrics_sums_prometheus.py`.
"""

from __future__ import annotations

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from istio_agent.metrics import (
    CollectorRegistry,
    Counter,
    DuplicateTimeseries,
    Sum,
    SumMetricFamily,
    generate_latest,
    generate_openmetrics,
)

# What upstream's agent served for its CSR counter (pilot-agent at the pinned version, one CSR made).
UPSTREAM_TEXT = (
    "# HELP istio_agent_num_outgoing_requests Number of total outgoing requests (e.g. to a token exchange server, "
    "CA, etc.)\n"
    "# TYPE istio_agent_num_outgoing_requests counter\n"
    'istio_agent_num_outgoing_requests{request_type="csr"} 1\n'
)


def test_a_labelled_sum_is_written_as_upstream_writes_it() -> None:
    registry = CollectorRegistry()
    requests = Sum("istio_agent_num_outgoing_requests",
                   "Number of total outgoing requests (e.g. to a token exchange server, CA, etc.)",
                   ["request_type"], registry=registry)
    requests.labels("csr").inc()
    text = generate_latest(registry).decode()
    # Byte for byte but the number, which is Python's spelling as in every family of ours (`1.0`; Go: `1`).
    assert text == UPSTREAM_TEXT.replace("} 1\n", "} 1.0\n")
    assert [(f.name, f.type, f.samples) for f in parse_text(text)] == [
        (f.name, f.type, f.samples) for f in parse_text(UPSTREAM_TEXT)]


def test_a_name_ending_in_total_keeps_it_and_gets_no_second_suffix() -> None:
    registry = CollectorRegistry()
    failures = Sum("istio_agent_num_file_secret_failures_total", "Number of times secret generation failed for files",
                   registry=registry)
    failures.inc(2)
    assert generate_latest(registry).decode() == (
        "# HELP istio_agent_num_file_secret_failures_total Number of times secret generation failed for files\n"
        "# TYPE istio_agent_num_file_secret_failures_total counter\n"
        "istio_agent_num_file_secret_failures_total 2.0\n")
    # A prometheus_client-style counter of the same name would have taken the suffix off the family.
    assert Counter("x_total", "x").name == "x"


def test_series_names_survive_both_parsers() -> None:
    registry = CollectorRegistry()
    terminations = Sum("istio_agent_envoy_connection_terminations", "The total number of connection errors from envoy",
                       ["type"], registry=registry)
    terminations.labels("cancelled").inc()
    terminations.labels("error").inc(3)
    family = SumMetricFamily("istio_agent_xds_proxy_requests", "The total number of Xds Proxy Requests", value=8)

    class Collector:
        def collect(self) -> list[SumMetricFamily]:
            return [family]

    registry.register(Collector())
    text = generate_latest(registry).decode()
    assert "# TYPE istio_agent_xds_proxy_requests counter\nistio_agent_xds_proxy_requests 8.0\n" in text
    assert "_created" not in text
    assert ('istio_agent_envoy_connection_terminations{type="error"} 3.0\n' in text
            and 'istio_agent_envoy_connection_terminations{type="cancelled"} 1.0\n' in text)
    # prometheus_client's text parser reads a counter's series as `_total` whatever they are called: it reads
    # this page exactly as it reads upstream's (the Go agent's spelling of the same values).
    go_spelling = text.replace(" 1.0\n", " 1\n").replace(" 3.0\n", " 3\n").replace(" 8.0\n", " 8\n")
    assert [(f.name, f.type, f.samples) for f in parse_text(text)] == [
        (f.name, f.type, f.samples) for f in parse_text(go_spelling)]
    # OpenMetrics wants `_total` on a counter's series: there the family has no TYPE ("unknown"), names kept.
    openmetrics = generate_openmetrics(registry).decode()
    assert openmetrics == "".join(line for line in text.splitlines(keepends=True)
                                  if not line.startswith("# TYPE")) + "# EOF\n"
    parsed = list(parse_openmetrics(openmetrics))
    assert {(f.name, f.type) for f in parsed} == {("istio_agent_envoy_connection_terminations", "unknown"),
                                                 ("istio_agent_xds_proxy_requests", "unknown")}
    assert {s.name for f in parsed for s in f.samples} == {"istio_agent_envoy_connection_terminations",
                                                          "istio_agent_xds_proxy_requests"}


def test_a_sum_only_goes_up_and_clashes_like_a_counter() -> None:
    registry = CollectorRegistry()
    total = Sum("istio_agent_scrapes_total", "The total number of scrapes.", registry=registry)
    with pytest.raises(ValueError, match="non-negative"):
        total.inc(-1)
    with pytest.raises(DuplicateTimeseries):
        Counter("istio_agent_scrapes", "again", registry=registry)
