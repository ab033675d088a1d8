"""The live view's pure parts: stats parsing, rate and percentile math, the window, changes, rendering."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from istiod_local.meshview.collector import parse_certs, parse_istiod_metrics, split_address
from istiod_local.meshview.model import (
    History,
    IstiodSample,
    MeshEvent,
    PodSample,
    ViewTarget,
    build_view,
    changes,
    outbound_host,
)
from istiod_local.meshview.render import log_lines, render_text
from istiod_local.meshview.stats import (
    ENVOY_STATS_FILTER,
    AgentStats,
    ClusterStats,
    EnvoyStats,
    Histogram,
    cumulative,
    histogram_delta,
    increase,
    merge_histograms,
    parse_agent_metrics,
    parse_envoy_stats,
    prometheus_samples,
    quantile,
    rate,
)

ECHO = "outbound|80||echo.default.svc.cluster.local"
BOUNDS = (0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, math.inf)


# ---- percentiles and rates ------------------------------------------------------------------------------------

def test_quantile_interpolates_inside_the_bucket_as_histogram_quantile_does() -> None:
    h = Histogram((10.0, 20.0, 40.0), (0.0, 50.0, 100.0))
    assert quantile(0.5, h) == 20.0
    assert quantile(0.25, h) == pytest.approx(15.0)
    assert quantile(0.75, h) == pytest.approx(30.0)
    assert quantile(0.99, h) == pytest.approx(39.6)


def test_quantile_of_nothing_is_unknown_and_the_inf_bucket_reports_its_lower_bound() -> None:
    assert quantile(0.5, None) is None
    assert quantile(0.5, Histogram((1.0, math.inf), (0.0, 0.0))) is None
    assert quantile(0.99, Histogram((1.0, 2.0, math.inf), (10.0, 10.0, 12.0))) == 2.0
    assert quantile(0.5, Histogram((1.0, 2.0, math.inf), (0.0, 4.0, 4.0))) == pytest.approx(1.5)


def test_quantile_of_observations_lands_in_their_buckets() -> None:
    h = cumulative(BOUNDS, [0.3] * 90 + [7.0] * 9 + [70.0])
    assert 0 < (quantile(0.5, h) or 0) <= 0.5
    assert 50.0 < (quantile(0.999, h) or 0) <= 100.0
    assert 5.0 < (quantile(0.95, h) or 0) <= 10.0


def test_rate_and_a_counter_reset() -> None:
    assert rate(100, 160, 6.0) == 10.0
    assert increase(100, 30) == 30  # Envoy restarted: its counter began again at 0
    assert rate(1, 5, 0.0) == 0.0


def test_histogram_delta_and_merge() -> None:
    before, after = cumulative(BOUNDS, [0.3, 7.0]), cumulative(BOUNDS, [0.3, 7.0, 0.4, 0.4, 30.0])
    delta = histogram_delta(before, after)
    assert delta is not None and delta.total == 3 and delta.counts[0] == 2
    assert histogram_delta(after, before) == before  # reset: the later snapshot alone
    assert histogram_delta(None, after) == after
    merged = merge_histograms([before, after, Histogram((1.0,), (5.0,))])
    assert merged is not None and merged.total == 7  # the odd-bounded one is left out
    assert merge_histograms([]) is None


# ---- parsing ---------------------------------------------------------------------------------------------------

ENVOY_JSON = {"stats": [
    {"name": f"cluster.{ECHO}.upstream_cx_total", "value": 3},
    {"name": f"cluster.{ECHO}.upstream_rq_total", "value": 30},
    {"name": f"cluster.{ECHO}.upstream_rq_5xx", "value": 2},
    {"name": "cluster.inbound|8080||.upstream_rq_total", "value": 7},
    {"histograms": [
        {"name": f"cluster.{ECHO}.external.upstream_rq_time",
         "buckets": [{"upper_bound": 0.5, "interval": 0, "cumulative": 99}]},
        {"name": f"cluster.{ECHO}.upstream_rq_time",
         "buckets": [{"upper_bound": 0.5, "interval": 0, "cumulative": 20},
                     {"upper_bound": 1, "interval": 0, "cumulative": 30}]},
    ]},
]}


def test_envoy_json_stats_by_cluster_with_buckets_and_without_the_split_histograms() -> None:
    stats = parse_envoy_stats(json.dumps(ENVOY_JSON))
    echo = stats.clusters[ECHO]
    assert (echo.rq_total, echo.rq_5xx, echo.cx_total) == (30, 2, 3)
    assert echo.rq_time == Histogram((0.5, 1.0), (20.0, 30.0))
    assert stats.clusters["inbound|8080||"].rq_total == 7
    with pytest.raises(ValueError):
        parse_envoy_stats("not json")


def test_istio_alt_stat_names_end_in_a_semicolon() -> None:
    """istiod's clusters' stats are `<cluster>;.<stat>`; the origin-split copies follow the `;`."""
    doc = {"stats": [
        {"name": f"cluster.{ECHO};.upstream_rq_total", "value": 4},
        {"name": f"cluster.{ECHO};.upstream_cx_connect_fail", "value": 1},
        {"histograms": [
            {"name": f"cluster.{ECHO};.external.upstream_rq_time",
             "buckets": [{"upper_bound": 1, "cumulative": 9}]},
            {"name": f"cluster.{ECHO};.upstream_rq_time", "buckets": [{"upper_bound": 1, "cumulative": 4}]},
        ]},
    ]}
    stats = parse_envoy_stats(json.dumps(doc))
    assert list(stats.clusters) == [ECHO]
    echo = stats.clusters[ECHO]
    assert (echo.rq_total, echo.cx_connect_fail, echo.rq_time) == (4, 1, Histogram((1.0,), (4.0,)))


def test_the_envoy_filter_is_anchored_on_istio_cluster_names() -> None:
    import re

    pattern = re.compile(ENVOY_STATS_FILTER)
    assert pattern.search(f"cluster.{ECHO}.upstream_rq_total")
    assert pattern.search("cluster.inbound|8080||.upstream_rq_time")
    assert not pattern.search("cluster.xds-grpc.upstream_rq_total")
    assert not pattern.search(f"cluster.{ECHO}.upstream_rq_total_extra")


AGENT_METRICS = """\
# HELP istio_agent_cert_expiry_timestamp_seconds When
# TYPE istio_agent_cert_expiry_timestamp_seconds gauge
istio_agent_cert_expiry_timestamp_seconds{resource_name="default"} 1.7e+09
istio_agent_cert_expiry_timestamp_seconds{resource_name="ROOTCA"} 2e+09
istio_agent_cert_rotations_total{resource_name="default"} 3.0
istio_agent_certificates_issued_total 3.0
istio_agent_xds_pushes_total{type="cds"} 4.0
istio_agent_xds_pushes_total{type="lds"} 2.0
istio_agent_xds_nacks_total{type="lds",by="envoy"} 1.0
istio_agent_xds_nacks_total{type="lds",by="agent"} 1.0
istio_agent_dns_queries_total{outcome="local",protocol="udp"} 5.0
istio_agent_dns_queries_total{outcome="local",protocol="tcp"} 1.0
istio_agent_dns_queries_total{outcome="forwarded",protocol="udp"} 2.0
istio_agent_wasm_cache_entries 1.0
istio_agent_wasm_remote_fetch_count{result="success"} 2.0
istio_agent_wasm_remote_fetch_count{result="download_failure"} 1.0
istio_agent_wasm_remote_fetch_count{result="checksum_mismatched"} 1.0
envoy_cluster_upstream_rq_total{cluster_name="x"} 9
garbage line
"""


def test_agent_metrics() -> None:
    agent = parse_agent_metrics(AGENT_METRICS)
    assert agent.cert_expiry == 1.7e9 and agent.cert_rotations == 3 and agent.certificates_issued == 3
    assert agent.xds_pushes == {"cds": 4, "lds": 2} and agent.xds_nacks == {"lds": 2}
    assert (agent.dns_local, agent.dns_forwarded, agent.dns_failed) == (6, 2, 0)
    assert (agent.wasm_modules, agent.wasm_fetch_failures) == (1, 2), "failures whatever their reason"


def test_prometheus_samples_unescape_labels_and_skip_what_does_not_parse() -> None:
    text = 'm{a="x\\"y",b="c\\\\d"} 1\nm 2\nm{a="z"} nan-ish\n# m 3\n'
    assert prometheus_samples(text, "m") == [("m", {"a": 'x"y', "b": "c\\d"}, 1.0), ("m", {}, 2.0)]


def test_certs_pick_the_spiffe_chain_expiring_last() -> None:
    doc = {"certificates": [
        {"ca_cert": [{"subject_alt_names": [{"uri": "spiffe://ca"}]}], "cert_chain": []},
        {"cert_chain": [{"serial_number": "a1", "expiration_time": "2026-12-02T10:00:00Z",
                         "subject_alt_names": [{"uri": "spiffe://cluster.local/ns/default/sa/old"}]}]},
        {"cert_chain": [{"serial_number": "b2", "expiration_time": "2026-12-02T12:00:00Z",
                         "subject_alt_names": [{"dns": "x"}, {"uri": "spiffe://cluster.local/ns/default/sa/new"}]}]},
    ]}
    cert = parse_certs(json.dumps(doc))
    assert cert is not None and cert.identity.endswith("/sa/new") and cert.serial == "b2"
    assert cert.expiry == pytest.approx(1796212800.0)
    assert parse_certs('{"certificates": []}') is None


def test_istiod_metrics() -> None:
    text = ('pilot_xds{version="1.28.0"} 2\npilot_xds{version=""} 1\npilot_xds_pushes{type="cds"} 5\n'
            'pilot_total_xds_rejects{type="lds"} 1\nistiod_local_mesh_version 7\n'
            'istiod_local_last_push_timestamp_seconds 1700000000\n')
    sample = parse_istiod_metrics(text, 5.0)
    assert (sample.connected, sample.version, sample.last_push) == (3, "7", 1.7e9)
    assert sample.pushes == {"cds": 5} and sample.rejects == {"lds": 1}
    assert parse_istiod_metrics("istiod_local_last_push_timestamp_seconds 0\n", 0).last_push is None


def test_split_address() -> None:
    assert split_address("127.0.0.1:15014") == ("127.0.0.1", 15014)
    assert split_address("http://10.244.0.1:15014/") == ("10.244.0.1", 15014)
    assert split_address("[::1]:15014") == ("::1", 15014)


# ---- the window, views and changes ----------------------------------------------------------------------------

CLIENT = ViewTarget("client-1", "default", "10.244.0.2", "ns-client", "sidecar", "sleep")
ECHO_POD = ViewTarget("echo-1", "default", "10.244.0.3", "ns-echo", "sidecar", "echo")
PLAIN = ViewTarget("outside-1", "legacy", "10.244.0.4", "ns-plain", "none")


def client_sample(at: float, requests: float, errors: float = 0.0, times: list[float] | None = None,
                  ready: bool = True, issued: float = 1.0, nacks: float = 0.0) -> PodSample:
    rq_time = cumulative(BOUNDS, times or [])
    envoy = EnvoyStats({ECHO: ClusterStats(requests, errors, requests / 10, 0.0, rq_time),
                        "inbound|8080||": ClusterStats(1000.0)})
    agent = AgentStats(cert_expiry=at + 86000.0, certificates_issued=issued, xds_pushes={"cds": 3, "lds": 2},
                       xds_nacks={"lds": nacks}, dns_local=4, dns_forwarded=1)
    return PodSample(CLIENT, at, ready=ready, envoy=envoy, agent=agent,
                     identity="spiffe://cluster.local/ns/default/sa/sleep")


def test_rates_and_percentiles_over_the_window() -> None:
    history = History(window=10.0)
    history.add_pods([client_sample(100.0, 0.0), PodSample(PLAIN, 100.0)], 100.0)
    first = build_view(history, 100.0)
    assert first.services[0].rps == 0 and first.services[0].p50_ms is None  # no baseline yet
    history.add_pods([client_sample(105.0, 50.0, 5.0, [0.3] * 45 + [30.0] * 5), PodSample(PLAIN, 105.0)], 105.0)
    view = build_view(history, 105.0)
    (echo,) = view.services
    assert echo.host == "echo.default.svc.cluster.local" and echo.short == "echo.default"
    assert echo.rps == pytest.approx(10.0) and echo.errors_per_s == pytest.approx(1.0)
    assert echo.connections_per_s == pytest.approx(1.0) and echo.clients == 1 and echo.requests == 50
    assert echo.p50_ms is not None and 0 < echo.p50_ms <= 0.5
    assert echo.p99_ms is not None and 25 < echo.p99_ms <= 50


def test_the_window_keeps_one_baseline_older_than_itself() -> None:
    history = History(window=10.0)
    for t in range(0, 31):
        history.add_pods([client_sample(float(t), 10.0 * t)], float(t))
    ((oldest, newest),) = history.pods()
    assert newest.at == 30 and 19 <= oldest.at <= 20
    assert build_view(history, 30.0).services[0].rps == pytest.approx(10.0)


def test_two_clients_add_up_and_a_restarted_envoy_counts_from_zero() -> None:
    other = ViewTarget("client-2", "default", "10.244.0.9", "ns-c2", "sidecar", "sleep")
    history = History()
    a0 = client_sample(0.0, 100.0)
    b0 = PodSample(other, 0.0, envoy=EnvoyStats({ECHO: ClusterStats(500.0)}))
    history.add_pods([a0, b0], 0.0)
    a1 = client_sample(2.0, 120.0)
    b1 = PodSample(other, 2.0, envoy=EnvoyStats({ECHO: ClusterStats(8.0)}))  # restarted: 0 -> 8
    history.add_pods([a1, b1], 2.0)
    (echo,) = build_view(history, 2.0).services
    assert echo.rps == pytest.approx(10.0 + 4.0) and echo.clients == 2


def test_pod_views() -> None:
    history = History()
    history.add_pods([client_sample(10.0, 0, issued=3), PodSample(PLAIN, 10.0),
                      PodSample(ECHO_POD, 10.0, ready=False, error="Envoy admin: refused")], 10.0)
    client, plain, echo = build_view(history, 10.0).pods
    assert client.identity_confirmed and client.rotations == 2 and client.cert_expires_in == pytest.approx(86000.0)
    assert client.xds["lds"].acks == 2 and client.xds["lds"].nacks == 0 and list(client.xds) == ["cds", "lds"]
    assert (client.dns_local, client.dns_forwarded) == (4, 1)
    assert plain.identity == "" and plain.ready is None
    assert echo.identity == "spiffe://cluster.local/ns/default/sa/echo" and not echo.identity_confirmed
    assert echo.error == "Envoy admin: refused"


def test_changes_name_each_step_once() -> None:
    history = History()
    history.add_pods([client_sample(0.0, 0.0, ready=False)], 0.0)
    history.add_istiod(IstiodSample(0.0, True, 1, version="3"))
    v0 = build_view(history, 0.0)
    assert changes(None, v0) == ["pod default/client-1 added: 10.244.0.2 sidecar "
                                 "spiffe://cluster.local/ns/default/sa/sleep",
                                 "istiod-local monitoring reachable", "istiod-local: 1 proxies connected"]
    history.add_pods([client_sample(1.0, 10.0, ready=True, issued=2, nacks=1), PodSample(ECHO_POD, 1.0)], 1.0)
    history.add_istiod(IstiodSample(1.0, True, 2, version="4", rejects={"lds": 1}))
    history.add_event(MeshEvent(1.0, "mesh.yaml: echo replicas 1 -> 2"))
    v1 = build_view(history, 1.0)
    assert changes(v0, v1) == [
        "pod default/client-1 ready", "pod default/client-1 certificate rotated (1 so far)",
        "pod default/client-1 rejected LDS (1 NACKs)",
        "pod default/echo-1 added: 10.244.0.3 sidecar spiffe://cluster.local/ns/default/sa/echo",
        "service echo.default: traffic 10.0 req/s",
        "istiod-local: 2 proxies connected", "istiod-local pushed mesh version 4",
        "istiod-local: 1 more pushes rejected", "mesh.yaml: echo replicas 1 -> 2"]
    history.add_pods([client_sample(2.0, 10.0, ready=True, issued=2, nacks=1)], 2.0)
    history.add_event(MeshEvent(2.0, "a change the view saw", source="view"))
    v2 = build_view(history, 2.0)
    assert changes(v1, v2) == ["pod default/echo-1 removed"]
    assert changes(v2, v2) == []


# ---- rendering -------------------------------------------------------------------------------------------------

def fixed_view() -> tuple[str, list[str]]:
    history = History()
    history.add_pods([client_sample(0.0, 0.0), PodSample(PLAIN, 0.0)], 0.0)
    history.add_pods([client_sample(4.0, 40.0, 0.0, [0.3] * 40), PodSample(PLAIN, 4.0)], 4.0)
    history.add_istiod(IstiodSample(4.0, True, 2, pushes={"cds": 6, "lds": 4}, rejects={"lds": 1},
                                    last_push=1.0, version="5"))
    history.add_event(MeshEvent(3.0, "mesh.yaml applied: echo replicas 1 -> 2"))
    view = build_view(history, 4.0)
    return render_text(view, width=170), log_lines(view.at, changes(None, view))


def test_render_a_fixed_view() -> None:
    text, _ = fixed_view()
    lines = text.splitlines()
    assert lines[0].startswith("istio-agent mesh view")
    client = next(line for line in lines if "default/client-1" in line)
    for cell in ("10.244.0.2", "sidecar", "spiffe://cluster.local/ns/default/sa/sleep", "23.9h", "ready",
                 "CDS 3/0 LDS 2/0", "4/1"):
        assert cell in client, (cell, client)
    plain = next(line for line in lines if "legacy/outside-1" in line)
    assert "none" in plain and "spiffe" not in plain and "ready" not in plain
    echo = next(line for line in lines if "echo.default" in line)
    assert echo.split("│")[1:-1] == ["echo.default ", "  10.0 ", "     0 ", "    0.2 ", "    0.5 ", "    1.0 ",
                                       "       1"]
    assert ("istiod-local: 2 proxies connected, mesh version 5, 10 pushes (1 rejected), last push 3s ago"
            in text)
    assert "mesh.yaml applied: echo replicas 1 -> 2" in text.split("recent events:")[1]


def test_render_unknowns_and_an_unreachable_istiod() -> None:
    history = History()
    history.add_pods([PodSample(ECHO_POD, 0.0, error="status port: refused")], 0.0)
    history.add_istiod(IstiodSample(0.0, False, error="connection refused"))
    text = render_text(build_view(history, 0.0))
    row = next(line for line in text.splitlines() if "default/echo-1" in line)
    assert "?" in row and " - " in row
    assert "istiod-local: monitoring unreachable (connection refused)" in text


def test_plain_log_lines_carry_a_time_and_one_change_each() -> None:
    _, lines = fixed_view()
    assert all(len(line.split(" ", 1)[0]) == 8 for line in lines)
    assert any(line.endswith("pod legacy/outside-1 added: 10.244.0.4 none") for line in lines)
    assert any(line.endswith("service echo.default: traffic 10.0 req/s") for line in lines)


def test_a_target_with_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="mode 'ambient'"):
        ViewTarget("x", "default", "10.0.0.1", None, "ambient")


def test_outbound_host() -> None:
    assert outbound_host("outbound|80|v1|echo.default.svc.cluster.local") == "echo.default.svc.cluster.local"
    assert outbound_host("inbound|8080||") is None
    assert outbound_host("BlackHoleCluster") is None


def test_a_short_terminal_keeps_the_failing_pods_services_and_events_and_counts_the_rest() -> None:
    history = History()
    pods = [PodSample(ViewTarget(f"echo-{i}", "default", f"10.244.1.{i}", None, "sidecar", "echo"), 0.0,
                      ready=i not in (17, 33)) for i in range(1, 51)]
    history.add_pods([client_sample(0.0, 0.0), *pods], 0.0)
    history.add_istiod(IstiodSample(0.0, True, 51, version="2"))
    history.add_event(MeshEvent(0.0, "mesh.yaml applied"))
    text = render_text(build_view(history, 0.0), width=170, height=40)
    lines = text.splitlines()
    assert len(lines) <= 40, text
    assert "pods (51; 49 of 51 in the mesh ready)" in text
    shown = [line for line in lines if line.startswith("│default/echo-")]
    assert any("echo-17 " in line and "not ready" in line for line in shown)
    assert any("echo-33 " in line and "not ready" in line for line in shown)
    more = next(line for line in lines if "more (" in line)
    hidden = 51 - len(shown) - 1  # client-1 is shown too
    assert f"… {hidden} more ({hidden} ready)" in more
    assert "echo.default" in text and "istiod-local: 51 proxies connected" in text
    assert "mesh.yaml applied" in text


def test_a_pem_workload_certificate_gives_identity_expiry_and_serial() -> None:
    from istio_agent.pki import certs, keys
    from istiod_local.meshview.collector import parse_pem_certificate

    key = keys.generate_key("ECDSA")
    ca = certs.new_root_ca(key, "cluster.local", 1_700_000_000.0, 86400.0 * 10)
    csr = certs.load_csr(certs.build_csr(key, ["spiffe://cluster.local/ns/default/sa/greeter"]))
    leaf = certs.sign_workload_csr(ca, csr, "spiffe://cluster.local/ns/default/sa/greeter", 1_700_000_000.0, 3600.0)
    chain = (certs.cert_to_pem(leaf) + certs.cert_to_pem(ca.cert)).encode()
    cert = parse_pem_certificate(chain)
    assert cert is not None and cert.identity == "spiffe://cluster.local/ns/default/sa/greeter"
    assert cert.expiry == 1_700_003_600.0 and cert.serial == certs.serial_hex(leaf)
    assert parse_pem_certificate(certs.cert_to_pem(ca.cert).encode()) is None  # no SPIFFE SAN in a root
    with pytest.raises(ValueError):
        parse_pem_certificate(b"not a certificate")


UPSTREAM_AGENT_METRICS = """\
istio_agent_cert_expiry_seconds{resource_name="default"} 86398.9
istio_agent_dns_requests_total 7
istio_agent_dns_upstream_requests_total 2
istio_agent_dns_upstream_failures_total 1
"""


def test_upstreams_go_agent_counts_dns_in_its_own_series() -> None:
    agent = parse_agent_metrics(UPSTREAM_AGENT_METRICS)
    assert (agent.dns_local, agent.dns_forwarded, agent.dns_failed) == (5, 2, 1)
    # ours wins where both appear (a merged scrape never has both, but our names are the view's own)
    assert parse_agent_metrics(AGENT_METRICS + UPSTREAM_AGENT_METRICS).dns_local == 6


def test_the_view_says_which_agent_each_pod_runs() -> None:
    go = ViewTarget("go-1", "default", "10.244.0.5", "ns-go", "sidecar", "go", agent="upstream")
    history = History()
    history.add_pods([PodSample(go, 0.0, ready=True), PodSample(ECHO_POD, 0.0, ready=True), PodSample(PLAIN, 0.0)],
                     0.0)
    view = build_view(history, 0.0)
    assert [p.agent for p in view.pods] == ["upstream", "istio-agent", ""]
    lines = render_text(view, width=200).splitlines()
    header = next(line for line in lines if "identity" in line)
    assert [c.strip() for c in header.split("┃")[1:5]] == ["pod", "ip", "mode", "agent"], header
    assert "upstream" in next(line for line in lines if "default/go-1" in line)
    assert "istio-agent" in next(line for line in lines if "default/echo-1" in line)
    assert changes(None, view)[0] == "pod default/go-1 added: 10.244.0.5 sidecar (upstream's agent) " \
                                     "spiffe://cluster.local/ns/default/sa/go"


def test_the_real_istiods_monitoring_port_is_shown_as_its_own() -> None:
    text = ("# TYPE pilot_xds gauge\npilot_xds{version=\"1.29\"} 9\n"
            "pilot_xds_pushes{type=\"cds\"} 12\npilot_xds_pushes{type=\"eds\"} 30\n")
    sample = parse_istiod_metrics(text, 5.0, "istiod")
    assert (sample.name, sample.connected, sample.pushes) == ("istiod", 9, {"cds": 12.0, "eds": 30.0})
    history = History()
    history.add_istiod(sample)
    view = build_view(history, 5.0)
    assert "istiod: 9 proxies connected, 42 pushes (0 rejected)" in render_text(view, width=170)
    assert changes(None, view)[:2] == ["istiod monitoring reachable", "istiod: 9 proxies connected"]
    history.add_istiod(parse_istiod_metrics(text.replace("30", "33"), 6.0, "istiod"))
    assert changes(view, build_view(history, 6.0)) == ["istiod: 3 pushes"]


def test_the_view_shows_the_wasm_modules_an_agent_holds_and_its_failed_fetches() -> None:
    history = History()
    history.add_pods([client_sample(0.0, 0.0), PodSample(PLAIN, 0.0)], 0.0)
    before = build_view(history, 0.0)
    sample = client_sample(1.0, 0.0)
    assert sample.agent is not None
    history.add_pods([dataclasses.replace(sample, agent=dataclasses.replace(sample.agent, wasm_modules=1.0)),
                      PodSample(PLAIN, 1.0)], 1.0)
    after = build_view(history, 1.0)
    assert changes(before, after) == ["pod default/client-1 holds 1 Wasm module"]
    row = next(line for line in render_text(after, width=200).splitlines() if "default/client-1" in line)
    assert row.rstrip(" │").endswith("1"), row
    plain = next(line for line in render_text(before, width=200).splitlines() if "legacy/outside-1" in line)
    assert plain.rstrip(" │").endswith("-"), plain
    history.add_pods([dataclasses.replace(sample, at=2.0, agent=dataclasses.replace(
        sample.agent, wasm_modules=1.0, wasm_fetch_failures=2.0))], 2.0)
    failed = build_view(history, 2.0)
    assert changes(after, failed)[0] == "pod default/client-1 failed to fetch a Wasm module (2 so far)"
    assert "1 (2 failed)" in render_text(failed, width=200)
