"""The built-in bootstrap rendering: ProxyConfig-driven parts, checked as data and as Envoy protos."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from envoy_types import as_envoy_bootstrap

from istio_agent.config import env
from istio_agent.config.errors import ConfigError
from istio_agent.config.node import MetadataOptions, node_metadata
from istio_agent.config.proxyconfig import ProxyConfig
from istio_agent.envoy.bootstrap.options import BootstrapOptions
from istio_agent.envoy.bootstrap.render import render_bootstrap


def as_envoy_proto(bootstrap: dict[str, Any]) -> Any:
    return as_envoy_bootstrap(bootstrap)


def options(pc: dict[str, Any] | None = None, environ: dict[str, str] | None = None,
            annotations: dict[str, str] | None = None, ips: tuple[str, ...] = ("10.1.1.1",),
            node_id: str = "sidecar~10.1.1.1~p.ns~ns.svc.cluster.local", outlier_log_path: str = "",
            **kwargs: Any) -> BootstrapOptions:
    """As pilot-agent builds them: node metadata from the environment and annotations, then the bootstrap's inputs."""
    config = ProxyConfig()
    config.values.update(pc or {})
    environment = env.Environment(environ or {})
    metadata = node_metadata(MetadataOptions(
        environment, config.to_json(), instance_ips=ips, annotations=annotations or {},
        outlier_log_path=outlier_log_path,
        exit_on_zero_active_connections=environment.get(env.EXIT_ON_ZERO_ACTIVE_CONNECTIONS),
    ))
    return BootstrapOptions(node_id, config.to_json(), metadata, instance_ips=tuple(dict.fromkeys(ips)),
                            delta_xds=environment.get(env.ISTIO_DELTA_XDS), **kwargs)


def clusters(b: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in b["static_resources"]["clusters"]}


def test_default_bootstrap_is_a_valid_envoy_bootstrap() -> None:
    b = render_bootstrap(options())
    proto = as_envoy_proto(b)
    assert proto.admin.address.socket_address.port_value == 15000
    assert proto.dynamic_resources.ads_config.api_type == proto.dynamic_resources.ads_config.DELTA_GRPC
    assert list(clusters(b)) == ["prometheus_stats", "agent", "sds-grpc", "xds-grpc"]
    assert clusters(b)["xds-grpc"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] == {
        "pipe": {"path": "./etc/istio/proxy/XDS"}}
    sds = clusters(b)["sds-grpc"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    assert sds == {"pipe": {"path": "./var/run/secrets/workload-spiffe-uds/socket"}}
    names = [listener["name"] for listener in b["static_resources"]["listeners"]]
    assert names == ["0.0.0.0_15090", "0.0.0.0_15021"]
    assert "tracing" not in b and "stats_sinks" not in b
    assert b["node"]["cluster"] == "istio-proxy"


def test_sotw_when_delta_is_off_and_waypoints_force_delta() -> None:
    b = render_bootstrap(options(environ={"ISTIO_DELTA_XDS": "false"}))
    assert b["dynamic_resources"]["ads_config"]["api_type"] == "GRPC"
    w = render_bootstrap(options(environ={"ISTIO_DELTA_XDS": "false"}, node_id="waypoint~1.1.1.1~w.ns~ns.svc"))
    assert w["dynamic_resources"]["ads_config"]["api_type"] == "DELTA_GRPC"
    assert w["bootstrap_extensions"][0]["name"] == "metadata_discovery"
    patterns = w["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"]
    assert patterns[:2] == [{"prefix": "reporter="}, {"prefix": "workload_discovery"}]


@pytest.mark.parametrize(("tracing", "name", "cluster"), [
    ({"zipkin": {"address": "zipkin.istio-system:9411"}}, "envoy.tracers.zipkin", "zipkin"),
    ({"datadog": {"address": "$(HOST_IP):8126"}}, "envoy.tracers.datadog", "datadog_agent"),
    ({"lightstep": {"address": "ls:8080", "accessToken": "t"}}, "envoy.tracers.lightstep", "lightstep"),
])
def test_tracers(tracing: dict[str, Any], name: str, cluster: str) -> None:
    b = render_bootstrap(options({"tracing": tracing}, host_ip="192.168.0.9"))
    as_envoy_proto(b)
    assert b["tracing"]["http"]["name"] == name
    assert b["tracing"]["http"]["typed_config"]["collector_cluster"] == cluster
    address = clusters(b)[cluster]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    if cluster == "datadog_agent":
        assert address["socket_address"] == {"address": "192.168.0.9", "port_value": 8126}
        assert b["tracing"]["http"]["typed_config"]["service_name"] == b["node"]["cluster"]
    if cluster == "lightstep":
        assert b["tracing"]["http"]["typed_config"]["access_token_file"] == \
            "etc/istio/proxy/lightstep_access_token.txt"


@pytest.mark.parametrize(("address", "reason"), [
    ("zipkin", "address 'zipkin' must be host:port"),
    (":9411", "address ':9411' must be host:port"),
    ("fd00::9:9411", "IPv6 address 'fd00::9:9411' must be written [addr]:port"),
    ("zipkin:http", "address 'zipkin:http' has no numeric port"),
    ("zipkin:99999", "port 99999 out of range"),
])
def test_tracer_address_refusals_name_the_field(address: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=r"field tracing\.zipkin\.address: .*") as err:
        render_bootstrap(options({"tracing": {"zipkin": {"address": address}}}))
    assert reason in str(err.value)


def test_tracer_address_ipv6() -> None:
    b = render_bootstrap(options({"tracing": {"zipkin": {"address": "[fd00::9]:9411"}}}))
    address = clusters(b)["zipkin"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    assert address["socket_address"] == {"address": "fd00::9", "port_value": 9411}


def test_tracing_tls_modes() -> None:
    b = render_bootstrap(options({"tracing": {"zipkin": {"address": "z:9411"},
                                              "tlsSettings": {"mode": "ISTIO_MUTUAL"}}}))
    as_envoy_proto(b)
    tls = clusters(b)["zipkin"]["transport_socket"]["typed_config"]
    assert tls["sni"] == "tracer"
    assert tls["common_tls_context"]["tls_certificate_sds_secret_configs"][0]["name"] == "default"
    root = tls["common_tls_context"]["combined_validation_context"]["validation_context_sds_secret_config"]
    assert root["name"] == "ROOTCA"
    assert "alpn_protocols" not in tls["common_tls_context"]  # zipkin is not HTTP/2

    simple = render_bootstrap(options({"tracing": {"zipkin": {"address": "z:9411"}, "tlsSettings": {
        "mode": "SIMPLE", "caCertificates": "/etc/zipkin/ca.pem", "subjectAltNames": ["z.example"]}}}))
    context = clusters(simple)["zipkin"]["transport_socket"]["typed_config"]["common_tls_context"]
    assert context["combined_validation_context"] == {
        "default_validation_context": {"match_subject_alt_names": [{"exact": "z.example"}]},
        "validation_context_sds_secret_config": {
            "name": "file-root:/etc/zipkin/ca.pem",
            "sds_config": {"api_config_source": {
                "api_type": "GRPC", "grpc_services": [{"envoy_grpc": {"cluster_name": "sds-grpc"}}],
                "set_node_on_first_message_only": True, "transport_api_version": "V3"},
                "resource_api_version": "V3"}}}


def test_metrics_and_access_log_services_and_statsd() -> None:
    pc = {
        "envoyMetricsService": {"address": "metrics:15000", "tlsSettings": {
            "mode": "MUTUAL", "caCertificates": "/ca.pem", "clientCertificate": "/c.pem", "privateKey": "/k.pem"},
            "tcpKeepalive": {"probes": 3, "time": "10s", "interval": "2s"}},
        "envoyAccessLogService": {"address": "als:15000"},
        "statsdUdpAddress": "10.1.1.1:9125",
    }
    b = render_bootstrap(options(pc))
    as_envoy_proto(b)
    ms = clusters(b)["envoy_metrics_service"]
    assert ms["upstream_connection_options"] == {"tcp_keepalive": {
        "keepalive_probes": 3, "keepalive_time": 10, "keepalive_interval": 2}}
    context = ms["transport_socket"]["typed_config"]["common_tls_context"]
    assert context["alpn_protocols"] == ["h2"]
    assert context["tls_certificate_sds_secret_configs"][0]["name"] == "file-cert:/c.pem~/k.pem"
    assert "envoy_accesslog_service" in clusters(b)
    assert [s["name"] for s in b["stats_sinks"]] == ["envoy.stat_sinks.metrics_service", "envoy.stat_sinks.statsd"]


def test_bad_address_names_the_field() -> None:
    with pytest.raises(ConfigError, match="statsdUdpAddress"):
        render_bootstrap(options({"statsdUdpAddress": "no-port"}))


def test_runtime_values_and_connection_limit() -> None:
    b = render_bootstrap(options({"runtimeValues": {
        "re2.max_program_size.error_level": "", "a.b": "true", "c": "7",
        "overload.global_downstream_max_connections": "5000"}}, compliance_policy="fips-140-2", strip_fragment=False))
    layer = b["layered_runtime"]["layers"][0]["static_layer"]
    assert "re2.max_program_size.error_level" not in layer
    assert layer["a.b"] is True and layer["c"] == "7"
    assert layer["envoy.reloadable_features.google_grpc_disable_tls_13"] is True
    assert layer["envoy.reloadable_features.http_strip_fragment_from_path_unsafe_if_disabled"] == "false"
    monitor = b["overload_manager"]["resource_monitors"][0]["typed_config"]
    assert monitor["max_active_downstream_connections"] == 5000
    meta_wins = render_bootstrap(options(
        {"runtimeValues": {"overload.global_downstream_max_connections": "5000"},
         "proxyMetadata": {"ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS": "20000"}}))
    assert meta_wins["overload_manager"]["resource_monitors"][0]["typed_config"][
        "max_active_downstream_connections"] == 20000
    # Upstream reads the limit from ProxyConfig's proxyMetadata, not from the container's environment.
    env_only = render_bootstrap(options(environ={"ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS": "20000"}))
    assert env_only["overload_manager"]["resource_monitors"][0]["typed_config"][
        "max_active_downstream_connections"] == 2147483647


def test_stats_from_proxy_config_and_annotations() -> None:
    pc = {"proxyStatsMatcher": {"inclusionPrefixes": ["upstream_cx"], "inclusionRegexps": [".*cb.*"]},
          "extraStatTags": ["a", "", "b"]}
    b = render_bootstrap(options(pc, environ={"EXIT_ON_ZERO_ACTIVE_CONNECTIONS": "true"},
                                 annotations={"sidecar.istio.io/statsInclusionPrefixes": "http.{pod_ip}_",
                                              "sidecar.istio.io/extraStatTags": "b,c",
                                              "sidecar.istio.io/statsFlushInterval": "10s",
                                              "sidecar.istio.io/statsEvictionInterval": "30s"},
                                 ips=("10.1.1.1", "10.1.1.2")))
    as_envoy_proto(b)
    patterns = b["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"]
    prefixes = [p["prefix"] for p in patterns if "prefix" in p]
    assert prefixes[:3] == ["reporter=", "http.10.1.1.1_", "http.10.1.1.2_"]  # annotation replaces ProxyConfig
    assert "downstream_cx_active" in [p["suffix"] for p in patterns if "suffix" in p]
    assert [p["safe_regex"]["regex"] for p in patterns if "safe_regex" in p] == [".*cb.*", r"vhost\..*\.route\..*"]
    extra = [t["tag_name"] for t in b["stats_config"]["stats_tags"]][9:12]
    assert extra == ["a", "b", "c"]
    filters = b["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
    assert [f["name"] for f in filters] == [
        "envoy.filters.http.compressor.brotli", "envoy.filters.http.compressor.zstd",
        "envoy.filters.http.compressor.gzip", "envoy.filters.http.router"]
    assert (b["stats_flush_interval"], b["stats_eviction_interval"]) == ("10s", "30s")


def test_eviction_interval_must_be_a_multiple_of_flush() -> None:
    b = render_bootstrap(options(annotations={"sidecar.istio.io/statsEvictionInterval": "11s",
                                              "sidecar.istio.io/statsHistogramBuckets": '{"b":[1,2],"a":[0.5]}'}))
    assert "stats_eviction_interval" not in b
    assert b["stats_config"]["histogram_bucket_settings"] == [
        {"match": {"prefix": "a"}, "buckets": [0.5]}, {"match": {"prefix": "b"}, "buckets": [1, 2]}]


def test_ipv6_and_dual_stack() -> None:
    v6 = render_bootstrap(options(ips=("fd00::1",)))
    assert v6["admin"]["address"]["socket_address"]["address"] == "::1"
    assert v6["static_resources"]["listeners"][0]["name"] == "::_15090"
    dual = render_bootstrap(options({"tracing": {"zipkin": {"address": "z:9411"}}},
                                    ips=("10.0.0.1", "fd00::1"), dual_stack=True))
    as_envoy_proto(dual)
    listener = dual["static_resources"]["listeners"][0]
    assert listener["additionalAddresses"][0]["address"]["socket_address"]["address"] == "::"
    assert clusters(dual)["zipkin"]["dns_lookup_family"] == "ALL"
    plain = render_bootstrap(options(ips=("10.0.0.1", "fd00::1")))
    assert "additionalAddresses" not in plain["static_resources"]["listeners"][0]


def test_service_cluster_and_locality() -> None:
    b = render_bootstrap(options(environ={"POD_NAMESPACE": "ns",
                                          "ISTIO_METAJSON_LABELS": '{"app": "web", "istio-locality": "r1.z1"}'}))
    assert b["node"]["cluster"] == "web.ns"
    assert b["node"]["locality"] == {"region": "r1", "zone": "z1"}
    custom = render_bootstrap(options({"serviceCluster": "mine"}))
    assert custom["node"]["cluster"] == "mine"
    canonical = render_bootstrap(options(
        {"serviceCluster": "", "tracingServiceName": "CANONICAL_NAME_AND_NAMESPACE"},
        environ={"POD_NAMESPACE": "ns", "ISTIO_METAJSON_LABELS": '{"service.istio.io/canonical-name": "c"}'}))
    assert canonical["node"]["cluster"] == "c.ns"


def test_log_as_json_lrs_and_deferred_switches() -> None:
    opts = options(log_as_json=True, environ={"ISTIO_META_LOAD_STATS_CONFIG_JSON": '{"api_type": "GRPC"}'},
                   outlier_log_path="/dev/stdout")
    b = render_bootstrap(opts)
    as_envoy_proto(b)
    assert "json_format" in b["application_log_config"]["log_format"]
    assert b["cluster_manager"]["load_stats_config"] == {"api_type": "GRPC"}
    assert b["cluster_manager"]["outlier_detection"] == {"event_log_path": "/dev/stdout"}
    off = render_bootstrap(dataclasses.replace(opts, deferred_cluster_creation=False, deferred_stats_creation=False))
    assert "enable_deferred_cluster_creation" not in off["cluster_manager"]
    assert "deferred_stat_options" not in off


def test_rendering_is_pure() -> None:
    opts = options({"tracing": {"zipkin": {"address": "z:9411"}}})
    assert render_bootstrap(opts) == render_bootstrap(opts)


def _reorder_in_place(node: Any) -> None:
    """Every dict's keys reversed, in place: what protobuf's ParseDict does to an Any (`@type` taken out, put back)."""
    if isinstance(node, dict):
        items = list(node.items())
        node.clear()
        node.update(reversed(items))
        for value in node.values():
            _reorder_in_place(value)
    elif isinstance(node, list):
        for value in node:
            _reorder_in_place(value)


def test_editing_a_rendering_leaves_the_next_one_byte_for_byte() -> None:
    """Found by the Envoy bootstrap differential: a test parsing one rendering as an Envoy proto moved the shared
    PROXY protocol filter's `@type` last, and our agent's later bootstraps in that process differed in key order."""
    opts = options({"tracing": {"zipkin": {"address": "z:9411"}, "customTags": {"lit": {"literal": {"value": "v"}}}},
                    "proxyStatsMatcher": {"inclusionPrefixes": ["tcp"]}, "runtimeValues": {"a.b": "1"}},
                   {"ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL": "true"}, ips=("10.0.0.1", "fd00::1"),
                   dual_stack=True, log_as_json=True, status_port_proxy_protocol=True)
    first = json.dumps(render_bootstrap(opts))
    once = render_bootstrap(opts)
    as_envoy_proto(once)
    _reorder_in_place(once)
    assert json.dumps(render_bootstrap(opts)) == first
