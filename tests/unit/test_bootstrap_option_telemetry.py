"""One test per bootstrap option upstream's pkg/bootstrap derives (stats, tracing, telemetry services, LRS).

Each test is named after the template parameter (`option.*` in pkg/bootstrap/option/instances.go) and
checks what the built-in bootstrap renders for it and what a custom template is given under that name.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from bootstrap_inputs import as_envoy_proto, both, clusters, endpoint, http_filters, listeners, options

from istio_agent.config.errors import ConfigError

PREFIXES = "sidecar.istio.io/statsInclusionPrefixes"
SUFFIXES = "sidecar.istio.io/statsInclusionSuffixes"
REGEXPS = "sidecar.istio.io/statsInclusionRegexps"


def patterns(b: dict[str, Any], kind: str) -> list[str]:
    found = b["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"]
    if kind == "safe_regex":
        return [p["safe_regex"]["regex"] for p in found if "safe_regex" in p]
    return [p[kind] for p in found if kind in p]


def test_option_inclusion_prefix() -> None:
    b, p = both(options({"proxyStatsMatcher": {"inclusionPrefixes": ["from_config"]}},
                        annotations={PREFIXES: "a,http.{pod_ip}_"}, ips=("10.1.1.1", "10.1.1.2")))
    assert p["inclusionPrefix"] == ["a", "http.10.1.1.1_", "http.10.1.1.2_", "cluster_manager", "listener_manager",
                                    "server", "cluster.xds-grpc", "wasm"], "the annotation replaces ProxyConfig"
    assert patterns(b, "prefix") == ["reporter=", *p["inclusionPrefix"], "component", "istio"]
    b, p = both(options({"proxyStatsMatcher": {"inclusionPrefixes": ["from_config"]}}))
    assert p["inclusionPrefix"][0] == "from_config"


def test_option_inclusion_suffix() -> None:
    b, p = both(options(annotations={SUFFIXES: "upstream_rq_1xx"}))
    assert p["inclusionSuffix"] == ["upstream_rq_1xx", "rbac.allowed", "rbac.denied", "shadow_allowed",
                                    "shadow_denied"]
    assert patterns(b, "suffix") == p["inclusionSuffix"]
    drain = both(options(environ={"EXIT_ON_ZERO_ACTIVE_CONNECTIONS": "true"}))[1]
    assert drain["inclusionSuffix"][-1] == "downstream_cx_active", "draining polls it"


def test_option_inclusion_regexps() -> None:
    b, p = both(options({"proxyStatsMatcher": {"inclusionRegexps": [".*cb.*"]}}))
    assert p["inclusionRegexps"] == [".*cb.*", r"vhost\..*\.route\..*"]
    assert patterns(b, "safe_regex") == p["inclusionRegexps"]
    assert patterns(both(options(annotations={REGEXPS: "x.*"}))[0], "safe_regex")[0] == "x.*"


def test_option_extra_stat_tags() -> None:
    b, p = both(options({"extraStatTags": ["a", "", "b"]}, annotations={"sidecar.istio.io/extraStatTags": "b,c"}))
    assert p["extraStatTags"] == ["a", "b", "c"]
    tags = b["stats_config"]["stats_tags"]
    assert [t["tag_name"] for t in tags][9:12] == ["a", "b", "c"]
    assert tags[9] == {"regex": "(a=\\.=(.*?);\\.;)", "tag_name": "a"}
    assert "extraStatTags" not in both(options())[1]


def test_option_histogram_buckets() -> None:
    b, p = both(options(annotations={"sidecar.istio.io/statsHistogramBuckets": '{"b": [1, 2.5], "a": [0.5]}'}))
    want = [{"match": {"prefix": "a"}, "buckets": [0.5]}, {"match": {"prefix": "b"}, "buckets": [1, 2.5]}]
    assert p["histogram_buckets"] == want == b["stats_config"]["histogram_bucket_settings"]
    broken = both(options(annotations={"sidecar.istio.io/statsHistogramBuckets": '{"a": [1], "b": ["x"]}'}))
    assert "histogram_bucket_settings" not in broken[0]["stats_config"], "one bad entry drops them all"
    assert not broken[1]["histogram_buckets"]


def test_option_stats_flush_interval() -> None:
    b, p = both(options(annotations={"sidecar.istio.io/statsFlushInterval": "90s"}))
    assert p["stats_flush_interval"] == "1m30s", "a Go time.Duration, as the template prints it"
    assert b["stats_flush_interval"] == "90s"
    bad, params = both(options(annotations={"sidecar.istio.io/statsFlushInterval": "soon"}))
    assert "stats_flush_interval" not in bad and "stats_flush_interval" not in params


def test_option_stats_eviction_interval() -> None:
    b, p = both(options(annotations={"sidecar.istio.io/statsEvictionInterval": "20s",
                                     "sidecar.istio.io/statsFlushInterval": "10s"}))
    assert p["stats_eviction_interval"] == b["stats_eviction_interval"] == "20s"
    assert both(options(annotations={"sidecar.istio.io/statsEvictionInterval": "10s"}))[0][
        "stats_eviction_interval"] == "10s"
    odd, params = both(options(annotations={"sidecar.istio.io/statsEvictionInterval": "11s"}))
    assert "stats_eviction_interval" not in odd and "stats_eviction_interval" not in params
    whole = both(options(annotations={"sidecar.istio.io/statsEvictionInterval": "7.5s",
                                      "sidecar.istio.io/statsFlushInterval": "2.5s"}))
    assert whole[0]["stats_eviction_interval"] == "7s", "upstream keeps whole seconds"


def test_option_envoy_metrics_stats_compression() -> None:
    b, p = both(options())
    assert p["envoy_metrics_stats_compression"] is True
    assert http_filters(listeners(b)["0.0.0.0_15090"]) == [
        "envoy.filters.http.compressor.brotli", "envoy.filters.http.compressor.zstd",
        "envoy.filters.http.compressor.gzip", "envoy.filters.http.router"]
    off, params = both(options({"statsCompression": False}))
    assert params["envoy_metrics_stats_compression"] is False
    assert http_filters(listeners(off)["0.0.0.0_15090"]) == ["envoy.filters.http.router"]
    gone = both(options(annotations={"sidecar.istio.io/statsCompression": "gzip"}))[0]
    assert len(http_filters(listeners(gone)["0.0.0.0_15090"])) == 4, "upstream removed that annotation"


@pytest.mark.parametrize(("tracing", "kind", "cluster", "tracer"), [
    ({"zipkin": {"address": "zipkin.istio-system:9411"}}, "zipkin", "zipkin", "envoy.tracers.zipkin"),
    ({"lightstep": {"address": "ls:8080", "accessToken": "t"}}, "lightstep", "lightstep", "envoy.tracers.lightstep"),
    ({"datadog": {"address": "$(HOST_IP):8126"}}, "datadog", "datadog_agent", "envoy.tracers.datadog"),
])
def test_option_zipkin_lightstep_datadog(tracing: dict[str, Any], kind: str, cluster: str, tracer: str) -> None:
    b, p = both(options({"tracing": tracing}, host_ip="192.168.0.9"))
    as_envoy_proto(b)
    host, port = endpoint(clusters(b)[cluster])["socket_address"].values()
    assert p[kind] == f'{{"address": "{host}", "port_value": {port}}}'
    assert b["tracing"]["http"]["name"] == tracer
    assert b["tracing"]["http"]["typed_config"]["collector_cluster"] == cluster
    if kind == "datadog":
        assert host == "192.168.0.9", "$(HOST_IP) is HOST_IP, as Kubernetes would have expanded it"
        assert b["tracing"]["http"]["typed_config"]["service_name"] == b["node"]["cluster"]
    assert [k for k in ("zipkin", "lightstep", "datadog") if k in p] == [kind]


def test_option_lightstep_token() -> None:
    b, p = both(options({"tracing": {"lightstep": {"address": "ls:8080", "accessToken": "t"}}}))
    assert p["lightstepToken"] == "etc/istio/proxy/lightstep_access_token.txt"
    assert b["tracing"]["http"]["typed_config"]["access_token_file"] == p["lightstepToken"]


def test_option_stackdriver() -> None:
    with pytest.raises(ConfigError, match="missing GCP Project"):
        both(options({"tracing": {"stackdriver": {"debug": True}}}))
    gcp = {"platform_metadata": {"gcp_project": "my-proj"}}
    b, p = both(options({"tracing": {"stackdriver": {"debug": True, "maxNumberOfAttributes": 7}}}, metadata=gcp))
    assert "tracing" not in b, "upstream's template renders no Stackdriver tracer"
    as_envoy_proto(b)
    assert {k: v for k, v in p.items() if k.startswith("stackdriver")} == {
        "stackdriver": True, "stackdriverProjectID": "my-proj", "stackdriverDebug": True,
        "stackdriverMaxAnnotations": 200, "stackdriverMaxAttributes": 7, "stackdriverMaxEvents": 200}
    assert "stackdriver" not in both(options({"tracing": {"zipkin": {"address": "z:9411"}}}, metadata=gcp))[1]


def test_an_empty_tracer_address_renders_no_tracer() -> None:
    b, p = both(options({"tracing": {"zipkin": {}}}))
    assert "tracing" not in b and "zipkin" not in clusters(b) and "zipkin" not in p
    assert "tracing" not in both(options({"tracing": {"openCensusAgent": {"address": "oc:55678"}}}))[0]


def test_option_tracing_tls() -> None:
    b, p = both(options({"tracing": {"zipkin": {"address": "z:9411"}, "tlsSettings": {
        "mode": "ISTIO_MUTUAL", "subjectAltNames": ["z.example"]}}}))
    as_envoy_proto(b)
    socket = clusters(b)["zipkin"]["transport_socket"]
    assert json.loads(p["tracing_tls"]) == socket
    tls = socket["typed_config"]
    assert tls["sni"] == "tracer"
    assert "alpn_protocols" not in tls["common_tls_context"], "zipkin is not HTTP/2"
    in_mesh = {"mode": "ISTIO_MUTUAL"}
    lightstep, _ = both(options({"tracing": {"lightstep": {"address": "l:1"}, "tlsSettings": in_mesh}}))
    alpn = clusters(lightstep)["lightstep"]["transport_socket"]["typed_config"]["common_tls_context"]["alpn_protocols"]
    assert alpn == ["istio", "h2"]
    off, params = both(options({"tracing": {"zipkin": {"address": "z:9411"}, "tlsSettings": {"mode": "DISABLE"}}}))
    assert params["tracing_tls"] == "" and "transport_socket" not in clusters(off)["zipkin"]


def test_option_statsd() -> None:
    b, p = both(options({"statsdUdpAddress": "10.1.1.1:9125"}))
    assert p["statsd"] == '{"address": "10.1.1.1", "port_value": 9125}'
    assert b["stats_sinks"][0]["typed_config"]["address"]["socket_address"] == {"address": "10.1.1.1",
                                                                                "port_value": 9125}
    with pytest.raises(ConfigError, match="statsdUdpAddress"):
        both(options({"statsdUdpAddress": "no-port"}))


METRICS = {"address": "metrics:15000", "tlsSettings": {
    "mode": "MUTUAL", "caCertificates": "/ca.pem", "clientCertificate": "/c.pem", "privateKey": "/k.pem"},
    "tcpKeepalive": {"probes": 3, "time": "10s", "interval": "2s"}}


def test_option_envoy_metrics_service_address() -> None:
    b, p = both(options({"envoyMetricsService": METRICS}))
    as_envoy_proto(b)
    assert p["envoy_metrics_service_address"] == '{"address": "metrics", "port_value": 15000}'
    assert clusters(b)["envoy_metrics_service"]["typed_extension_protocol_options"]
    assert b["stats_sinks"][0]["name"] == "envoy.stat_sinks.metrics_service"
    with pytest.raises(ConfigError, match="envoyMetricsServiceAddress"):
        both(options({"envoyMetricsServiceAddress": "metrics:15000"}))
    legacy = both(options({"envoyMetricsServiceAddress": "metrics:15000", "envoyMetricsService": {}}))[0]
    assert "envoy_metrics_service" not in clusters(legacy), "the deprecated field alone renders nothing"


def test_option_envoy_metrics_service_tls() -> None:
    b, p = both(options({"envoyMetricsService": METRICS}))
    socket = clusters(b)["envoy_metrics_service"]["transport_socket"]
    assert json.loads(p["envoy_metrics_service_tls"]) == socket
    context = socket["typed_config"]["common_tls_context"]
    assert context["alpn_protocols"] == ["h2"]
    assert context["tls_certificate_sds_secret_configs"][0]["name"] == "file-cert:/c.pem~/k.pem"
    overridden = both(options({"envoyMetricsService": METRICS}, environ={"ISTIO_META_TLS_CLIENT_KEY": "/m.pem"}))[0]
    name = clusters(overridden)["envoy_metrics_service"]["transport_socket"]["typed_config"]["common_tls_context"][
        "tls_certificate_sds_secret_configs"][0]["name"]
    assert name == "file-cert:/c.pem~/m.pem", "TLS_CLIENT_* metadata overrides the configured files"


def test_option_envoy_metrics_service_tcp_keepalive() -> None:
    b, p = both(options({"envoyMetricsService": METRICS}))
    assert clusters(b)["envoy_metrics_service"]["upstream_connection_options"] == {"tcp_keepalive": {
        "keepalive_probes": 3, "keepalive_time": 10, "keepalive_interval": 2}}
    assert json.loads(p["envoy_metrics_service_tcp_keepalive"]) == {"tcp_keepalive": {
        "keepalive_probes": {"value": 3}, "keepalive_time": {"value": 10}, "keepalive_interval": {"value": 2}}}


def test_option_envoy_accesslog_service_address_tls_and_tcp_keepalive() -> None:
    service = {**METRICS, "address": "als:15000"}
    b, p = both(options({"envoyAccessLogService": service}))
    as_envoy_proto(b)
    als = clusters(b)["envoy_accesslog_service"]
    assert p["envoy_accesslog_service_address"] == '{"address": "als", "port_value": 15000}'
    assert json.loads(p["envoy_accesslog_service_tls"]) == als["transport_socket"]
    assert "envoy_accesslog_service_tcp_keepalive" in p
    assert "stats_sinks" not in b, "an access-log service is no stats sink"


def test_option_load_stats_config_json_str() -> None:
    lrs = '{"api_type": "GRPC", "transport_api_version": "V3"}'
    b, p = both(options(environ={"ISTIO_META_LOAD_STATS_CONFIG_JSON": lrs}))
    assert p["load_stats_config_json_str"] == lrs
    assert b["cluster_manager"]["load_stats_config"] == json.loads(lrs)
    with pytest.raises(ConfigError, match="LOAD_STATS_CONFIG_JSON"):
        both(options(environ={"ISTIO_META_LOAD_STATS_CONFIG_JSON": "{not json"}))
