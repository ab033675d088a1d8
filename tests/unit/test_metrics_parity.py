"""istio_agent.metrics against prometheus_client, its real peer: the same metrics built in both, the same bytes out.

Each case builds its metrics through one function that takes either library's
classes (the APIs the agent uses have the same shape), renders both in text
0.0.4 and OpenMetrics 1.0.0 and compares the bytes. `_created` is pinned: our
registry's clock, and prometheus_client's `time.time`.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import prometheus_client
import prometheus_client.core
import prometheus_client.metrics
import prometheus_client.metrics_core
import prometheus_client.samples
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.exposition import generate_latest as their_text
from prometheus_client.openmetrics.exposition import generate_latest as their_openmetrics
from prometheus_client.utils import floatToGoString

from istio_agent import metrics as ours
from istio_agent.metrics import generate_latest as our_text
from istio_agent.metrics import generate_openmetrics as our_openmetrics

CREATED = 1_700_000_000.123456
THEIRS = SimpleNamespace(
    Registry=prometheus_client.CollectorRegistry, Counter=prometheus_client.Counter, Gauge=prometheus_client.Gauge,
    Histogram=prometheus_client.Histogram, CounterFamily=prometheus_client.core.CounterMetricFamily,
    GaugeFamily=prometheus_client.core.GaugeMetricFamily, Process=prometheus_client.ProcessCollector)
OURS = SimpleNamespace(
    Registry=lambda **kw: ours.CollectorRegistry(clock=lambda: CREATED, **kw), Counter=ours.Counter,
    Gauge=ours.Gauge, Histogram=ours.Histogram, CounterFamily=ours.CounterMetricFamily,
    GaugeFamily=ours.GaugeMetricFamily, Process=ours.ProcessCollector)

ODD_LABELS = ['a"b', "back\\slash", "new\nline", "ü→∞", "", "{x=1,y=2}", " spaced ", "tab\there", "\\n literal",
              "\"\\\n\"", "#", "le"]
ODD_FLOATS = [0.0, -0.0, 1.0, -1.0, 0.1 + 0.2, 1e-300, 5e-324, 1e300, 1.7976931348623157e308, 1234567.0,
              123456.7, 999999.9, 1000000.0, -1234567.0, 2.0**53, 1e16, 1e21, 1e22, 100000.0, 12345678.9,
              1.5e-7, 0.0001, 3.141592653589793, math.inf, -math.inf, math.nan, 42, 10**20]
HELP = 'Help with "quotes", a back\\slash,\na newline and ü.'


@pytest.fixture(autouse=True)
def pinned_created(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """prometheus_client stamps `_created` with time.time() and may have had it switched off by install-cni."""
    monkeypatch.setattr(time, "time", lambda: CREATED)
    monkeypatch.setattr(prometheus_client.metrics, "_use_created", True)
    yield


def both(build: Callable[[Any, Any], None], auto_describe: bool = False) -> tuple[Any, Any]:
    theirs, mine = THEIRS.Registry(auto_describe=auto_describe), OURS.Registry(auto_describe=auto_describe)
    build(THEIRS, theirs)
    build(OURS, mine)
    return theirs, mine


def assert_same(theirs: Any, mine: Any) -> bytes:
    expected_text, expected_om = their_text(theirs), their_openmetrics(theirs)
    assert our_text(mine).decode() == expected_text.decode()
    assert our_openmetrics(mine).decode() == expected_om.decode()
    assert our_openmetrics(mine, eof=False) + b"# EOF\n" == expected_om
    return expected_text


def test_instruments_with_odd_label_values() -> None:
    def build(lib: Any, registry: Any) -> None:
        counter = lib.Counter("odd_requests_total", HELP, ["zeta", "alpha"], registry=registry)
        gauge = lib.Gauge("odd_level", "Levels.", ["value"], registry=registry)
        for index, value in enumerate(ODD_LABELS):
            counter.labels(value, str(index)).inc(index)
            gauge.labels(value=value).set(index / 3)
        plain = lib.Counter("plain", "No labels.", registry=registry)
        plain.inc()
        plain.inc(2.5)
        lib.Gauge("plain_gauge", "No labels, never set.", registry=registry).dec(0.25)

    text = assert_same(*both(build))
    assert b'alpha="0",zeta="a\\"b"' in text and b'# HELP odd_requests_total Help with "quotes"' in text


def test_odd_values_in_every_format() -> None:
    def build(lib: Any, registry: Any) -> None:
        gauge = lib.Gauge("values", "Every odd float.", ["i"], registry=registry)
        for index, value in enumerate(ODD_FLOATS):
            gauge.labels(str(index)).set(value)
        counter = lib.Counter("big_total", "Large increments.", registry=registry)
        counter.inc(1e300)
        counter.inc(1234567)

    assert_same(*both(build))


def test_histograms_buckets_inf_sum_count_and_created() -> None:
    def build(lib: Any, registry: Any) -> None:
        default = lib.Histogram("default_seconds", "Default buckets.", registry=registry)
        for value in (0.001, 0.07, 3.0, 11.0, math.inf, 0.0):
            default.observe(value)
        labelled = lib.Histogram("labelled", "By path.", ["path"], buckets=(0.001, 0.005, 0.01, 0.1, 1.0, 5.0),
                                 registry=registry)
        labelled.labels("/a\"b").observe(0.003)
        labelled.labels("/").observe(1e-9)
        labelled.labels("/").observe(6.0)
        labelled.labels("unused")
        negative = lib.Histogram("temperature", "Negative first bound: no _sum.", buckets=(-10, 0, 10, math.inf),
                                 registry=registry)
        negative.observe(-20)
        negative.observe(5)
        big = lib.Histogram("big_bounds", "Bounds that need exponents.", buckets=(1e-7, 1234567, 1e22),
                            registry=registry)
        big.observe(2e6)

    text = assert_same(*both(build))
    assert b'labelled_bucket{le="+Inf",path="/"} 2.0' in text and b"temperature_sum" not in text


def test_custom_collectors_families_units_timestamps_and_empty_families() -> None:
    def build(lib: Any, registry: Any) -> None:
        class Custom:
            def collect(self) -> Iterator[Any]:
                yield lib.GaugeFamily("empty_gauge", "No samples.", labels=["x"])
                yield lib.CounterFamily("empty_counter_total", "No samples.", labels=["x"])
                remaining = lib.GaugeFamily("expiry", HELP, labels=["resource_name"], unit="seconds")
                remaining.add_metric(["default"], 86399.5)
                remaining.add_metric(['a"b\\c\nd'], -1.0)
                remaining.add_metric(["stamped"], 1.0, timestamp=1_700_000_000.5)
                yield remaining
                yield lib.CounterFamily("issued", "Certificates.", value=3)
                created = lib.CounterFamily("rotations_total", "With created.", labels=["r"])
                created.add_metric(["ROOTCA"], 2, created=1_600_000_000.25)
                created.add_metric(["default"], 0.0, created=1_600_000_001.0, timestamp=1_700_000_000.0)
                yield created
                yield lib.CounterFamily("bytes", "A counter with a unit.", value=1e-3, unit="bytes")

        registry.register(Custom())
        lib.Counter("sizes_total", "An instrument with a unit.", ["k"], unit="bytes", registry=registry).labels("v")
        lib.Counter("never_used", "A labelled counter with no children.", ["k"], registry=registry)

    text = assert_same(*both(build))
    assert text.endswith(b"# TYPE never_used_total counter\n")  # an empty family still has its HELP and TYPE


def process_dir(tmp_path: Path, command: str = "pilot-agent (x) y") -> Path:
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1699990000\nprocesses 42\n")
    pid = tmp_path / "4242"
    (pid / "fd").mkdir(parents=True)
    for fd in range(7):
        (pid / "fd" / str(fd)).write_text("")
    fields = [str(n) for n in range(3, 53)]
    fields[11], fields[12], fields[19], fields[20], fields[21] = "1234", "567", "890123", "123456789", "7890"
    (pid / "stat").write_text(f"4242 ({command}) " + " ".join(fields) + "\n")
    (pid / "limits").write_text(
        "Limit                     Soft Limit           Hard Limit           Units     \n"
        "Max cpu time              unlimited            unlimited            seconds   \n"
        "Max open files            1048576              1048576              files     \n")
    return tmp_path


def test_process_collector_same_series_and_sources(tmp_path: Path) -> None:
    proc = process_dir(tmp_path)
    assert_same(*both(lambda lib, registry: lib.Process(namespace="istio_agent", pid=lambda: 4242, proc=str(proc),
                                                        registry=registry)))
    # And this process's real /proc: the same families, in the same order.
    theirs, mine = both(lambda lib, registry: lib.Process(registry=registry))
    names = [(m.name, m.type, m.documentation) for m in theirs.collect()]
    assert [(m.name, m.type, m.documentation) for m in mine.collect()] == names
    assert len(names) == 6 and sys.platform == "linux"


def test_process_collector_without_proc(tmp_path: Path) -> None:
    theirs, mine = both(lambda lib, registry: lib.Process(proc=str(tmp_path / "missing"), registry=registry))
    assert our_text(mine) == their_text(theirs) == b""


def test_registry_refuses_clashing_series() -> None:
    for lib in (THEIRS, OURS):
        registry = lib.Registry(auto_describe=True)
        lib.Counter("requests", "Requests.", registry=registry)
        with pytest.raises(ValueError, match="Duplicated timeseries"):
            lib.Gauge("requests_total", "Clashes with the counter's series.", registry=registry)
        with pytest.raises(ValueError, match="Duplicated timeseries"):
            lib.Histogram("requests", "Same family name.", registry=registry)


def test_names_are_checked_where_prometheus_client_would_rewrite_them() -> None:
    # prometheus_client writes a `:` name as is in HELP/TYPE but as `_` in OpenMetrics sample lines; Prometheus
    # reserves colons for recording rules, so this package refuses them (and other non-plain names) up front.
    for bad in ("a:b", "1abc", "a-b", "", "ü"):
        with pytest.raises(ValueError):
            ours.Counter(bad, "x")
        with pytest.raises(ValueError):
            ours.GaugeMetricFamily(bad, "x")
    for bad_label in ("__reserved", "a-b", "1x"):
        with pytest.raises(ValueError):
            ours.Gauge("ok", "x", [bad_label])
    with pytest.raises(ValueError):
        ours.Histogram("ok", "x", ["le"])
    with pytest.raises(ValueError):
        ours.Counter("ok", "x").inc(-1)
    with pytest.raises(ValueError, match="missing label values"):
        ours.Counter("ok", "x", ["k"]).inc()
    with pytest.raises(ValueError):
        ours.Histogram("ok", "x", buckets=(2, 1))


@settings(max_examples=400, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(min_value=-(10**30), max_value=10**30))
def test_go_float_matches_prometheus_client(value: float) -> None:
    assert ours.go_float(value) == floatToGoString(value)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=12), st.floats()), max_size=6), st.text(max_size=30))
def test_any_label_values_and_help(series: list[tuple[str, float]], help_text: str) -> None:
    def build(lib: Any, registry: Any) -> None:
        family = lib.GaugeFamily("g", help_text, labels=["v"])
        for value, number in series:
            family.add_metric([value], number)
        counter = lib.Counter("c", help_text, ["v"], registry=registry)
        for value, _ in series:
            counter.labels(value).inc()

        class One:
            def collect(self) -> list[Any]:
                return [family]

        registry.register(One())

    assert_same(*both(build))


class Snapshot:
    """One collect() of a registry, rendered as often as needed (the process metrics move between collects)."""

    def __init__(self, metrics: list[Any]) -> None:
        self.metrics = metrics

    def collect(self) -> list[Any]:
        return self.metrics


def test_the_agents_own_metric_set_renders_as_prometheus_client_renders_it() -> None:
    """The agent's registry as it runs (agent, scrape, DNS and process metrics), each family handed to
    prometheus_client's renderers as its own Metric objects. Upstream's sums have no prometheus_client form
    (a counter whose series lack `_total`): they are left out here, and test_metrics_sums.py holds them to
    upstream's own bytes."""
    from istio_agent.dns.metrics import DnsMetrics
    from istio_agent.status.agent_metrics import XDS_CONNECT, XDS_ENVOY_NACK, XDS_PUSH, AgentMetrics
    from istio_agent.status.merged_metrics.handler import ScrapeCounters

    registry = OURS.Registry(auto_describe=True)
    metrics = AgentMetrics(registry)
    counters = ScrapeCounters(registry)
    dns = DnsMetrics(registry)
    metrics.xds_event(XDS_CONNECT, "sotw")
    metrics.xds_event(XDS_PUSH, "type.googleapis.com/envoy.config.cluster.v3.Cluster")
    metrics.xds_event(XDS_ENVOY_NACK, "type.googleapis.com/some.Unknown")
    metrics.ca_request("UNAVAILABLE", 0.0123)
    metrics.ca_request("OK", 31.0)
    metrics.secret_changed("file-cert:/etc/certs/cert-chain.pem~/etc/certs/key.pem")
    counters.scrapes.inc()
    counters.failures.labels("envoy").inc()
    dns.counts("udp")[0] += 3
    dns.upstream_latency.observe(0.002)

    collected = list(registry.collect())
    sums = {metric.name for metric in collected if not metric.suffixed}
    assert {"istio_agent_xds_proxy_requests", "istio_agent_num_outgoing_requests", "istio_agent_scrapes_total",
            "istio_agent_envoy_connection_terminations"} <= sums
    mine = Snapshot([metric for metric in collected if metric.suffixed])
    theirs = Snapshot([])
    for metric in mine.metrics:
        copy = prometheus_client.metrics_core.Metric(metric.name, metric.documentation, metric.type, metric.unit)
        copy.samples = [prometheus_client.samples.Sample(s.name, s.labels, s.value, s.timestamp)
                        for s in metric.samples]
        theirs.metrics.append(copy)
    text = assert_same(theirs, mine)
    for name in (b"istio_agent_process_cpu_seconds_total", b"istio_agent_dns_requests_total",
                 b'istio_agent_ca_request_duration_seconds_bucket{le="+Inf"} 2.0', b"istio_agent_ca_requests_created"):
        assert name in text


def test_created_series_can_be_turned_off_process_wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """PROMETHEUS_DISABLE_CREATED_SERIES (through the agent's options): counters and histograms lose `_created`."""
    from istio_agent.metrics import instruments

    registry = ours.CollectorRegistry()
    ours.Counter("c_requests", "Requests.", registry=registry).inc()
    ours.Histogram("h_seconds", "Latency.", buckets=(1.0,), registry=registry).observe(0.5)
    assert b"_created" in our_text(registry)
    monkeypatch.setattr(instruments, "USE_CREATED", True)
    instruments.set_created_series(False)
    assert b"_created" not in our_text(registry)
