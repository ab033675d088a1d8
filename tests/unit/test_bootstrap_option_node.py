"""One test per bootstrap option upstream's pkg/bootstrap derives (node, xDS, addresses, listeners, limits).

Each test is named after the template parameter (`option.*` in pkg/bootstrap/option/instances.go) and
checks what the built-in bootstrap renders for it and what a custom template is given under that name.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from bootstrap_inputs import as_envoy_proto, both, clusters, endpoint, listeners, options

from istio_agent.config.errors import ConfigError


def test_option_node_id() -> None:
    b, p = both(options(node_id="router~10.1.1.1~gw.ns~ns.svc.cluster.local"))
    assert b["node"]["id"] == p["nodeID"] == "router~10.1.1.1~gw.ns~ns.svc.cluster.local"


def test_option_node_type() -> None:
    _, p = both(options(node_id="waypoint~10.1.1.1~w.ns~ns.svc.cluster.local"))
    assert p["nodeType"] == "waypoint"


def test_option_cluster() -> None:
    b, p = both(options(environ={"POD_NAMESPACE": "ns", "ISTIO_METAJSON_LABELS": '{"app": "web"}'}))
    assert b["node"]["cluster"] == p["cluster"] == "web.ns"
    b, _ = both(options({"serviceCluster": "mine"}))
    assert b["node"]["cluster"] == "mine"
    b, _ = both(options({"tracingServiceName": "CANONICAL_NAME_AND_NAMESPACE"}, environ={
        "POD_NAMESPACE": "ns", "ISTIO_METAJSON_LABELS": '{"app": "a", "service.istio.io/canonical-name": "c"}'}))
    assert b["node"]["cluster"] == "c.ns", "a later tracingServiceName clears the default serviceCluster"


@pytest.mark.parametrize(("key", "label", "want"), [
    ("region", "r1", {"region": "r1"}),
    ("zone", "r1.z1", {"region": "r1", "zone": "z1"}),
    ("sub_zone", "r1.z1.s1", {"region": "r1", "zone": "z1", "sub_zone": "s1"}),
])
def test_option_region_zone_sub_zone(key: str, label: str, want: dict[str, str]) -> None:
    b, p = both(options(environ={"ISTIO_METAJSON_LABELS": json.dumps({"istio-locality": label})}))
    assert b["node"]["locality"] == want
    assert p[key] == want[key]
    assert "region" not in both(options())[1], "unset locality parts are absent from the parameters"


def test_option_region_and_zone_from_the_platform_without_a_locality_label() -> None:
    platform = {"region": "us-central1", "zone": "us-central1-f"}
    b, p = both(options(platform_locality=platform))
    assert b["node"]["locality"] == platform and (p["region"], p["zone"]) == ("us-central1", "us-central1-f")
    labelled = both(options(environ={"ISTIO_METAJSON_LABELS": '{"istio-locality": "r1"}'}, platform_locality=platform))
    assert labelled[0]["node"]["locality"] == {"region": "r1"}, "a locality label wins, even with fewer parts"
    empty_topology = options(environ={"ISTIO_METAJSON_LABELS": json.dumps(
        {"topology.istio.io/locality": "", "istio-locality": "r1.z1"})}, platform_locality=platform)
    assert both(empty_topology)[0]["node"]["locality"] == platform, \
        "an empty topology.istio.io/locality is the label found, and it is empty: the platform decides"


def test_option_meta_json_str() -> None:
    b, p = both(options(environ={"ISTIO_META_FOO": "a<b"}))
    assert json.loads(p["meta_json_str"]) == b["node"]["metadata"]
    assert "a\\u003cb" in p["meta_json_str"], "Go's encoding/json escapes <, > and &"


def test_option_metadata() -> None:
    _, p = both(options(environ={"POD_NAMESPACE": "ns", "ISTIO_META_DNS_CAPTURE": "true"}))
    go = p["metadata"]
    assert go["Namespace"] == "ns" and go["DNSCapture"] is True and go["InstanceIPs"] == ["10.1.1.1"]
    assert go["NodeName"] == "" and go["Labels"] is None, "typed fields read as Go's zero values when unset"
    assert go["ProxyConfig"]["ProxyAdminPort"] == 15000
    assert go["Raw"]["DNS_CAPTURE"] == "true"


def test_option_config() -> None:
    _, p = both(options({"concurrency": 3, "proxyMetadata": {"A": "b"}}))
    config = p["config"]
    assert config["ProxyAdminPort"] == 15000 and config["StatusPort"] == 15020
    assert config["Concurrency"] == {"Value": 3}
    assert config["ProxyMetadata"] == {"A": "b"}
    assert config["Tracing"] is None and config["MeshId"] == "" and config["InterceptionMode"] == "REDIRECT"


def test_option_runtime_flags() -> None:
    b, p = both(options({"runtimeValues": {"re2.max_program_size.error_level": "", "a": "true", "b": "7"}},
                        compliance_policy="fips-140-2", strip_fragment=False))
    layer = b["layered_runtime"]["layers"][0]["static_layer"]
    assert json.loads(p["runtime_flags"]) == layer
    assert "re2.max_program_size.error_level" not in layer
    assert layer["a"] is True and layer["b"] == "7"
    assert layer["envoy.reloadable_features.google_grpc_disable_tls_13"] is True
    assert layer["envoy.reloadable_features.http_strip_fragment_from_path_unsafe_if_disabled"] == "false"


def test_option_xds_type() -> None:
    assert both(options())[1]["xds_type"] == "DELTA_GRPC"
    b, p = both(options(environ={"ISTIO_DELTA_XDS": "false"}))
    assert b["dynamic_resources"]["ads_config"]["api_type"] == p["xds_type"] == "GRPC"
    waypoint = options(environ={"ISTIO_DELTA_XDS": "false"}, node_id="waypoint~1.1.1.1~w.ns~ns.svc")
    assert both(waypoint)[1]["xds_type"] == "DELTA_GRPC"


def test_option_metadata_discovery() -> None:
    b, p = both(options(environ={"ISTIO_META_ENABLE_HBONE": "true"}))
    assert p["metadata_discovery"] is True
    assert b["bootstrap_extensions"][0]["name"] == "metadata_discovery"
    assert b["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"][1] == {"prefix": "workload_discovery"}
    b, p = both(options(environ={"ISTIO_META_ENABLE_HBONE": "true", "ISTIO_DELTA_XDS": "false"}))
    assert p["metadata_discovery"] is False, "not on SotW xDS"
    assert [e["name"] for e in b["bootstrap_extensions"]] == ["envoy.bootstrap.internal_listener"]
    assert both(options(metadata={"metadata_discovery": True}))[1]["metadata_discovery"] is True


def test_option_pilot_san() -> None:
    _, p = both(options(metadata={"pilot_san": ("istiod.istio-system.svc", "b")}))
    assert p["pilot_SAN"] == '[{"exact":"istiod.istio-system.svc"},{"exact":"b"}]'
    assert both(options())[1]["pilot_SAN"] == "[]"


def test_option_pilot_grpc_address_discovery_address_and_host() -> None:
    _, p = both(options({"discoveryAddress": "istiod.istio-system.svc:15012"}))
    assert p["pilot_grpc_address"] == '{"address": "istiod.istio-system.svc", "port_value": 15012}'
    assert p["discovery_address"] == "istiod.istio-system.svc:15012"
    assert p["discovery_host"] == "istiod.istio-system.svc"
    with pytest.raises(ConfigError, match="discoveryAddress"):
        both(options({"discoveryAddress": "istiod"}))


def test_option_xds_root_cert() -> None:
    assert both(options())[1]["xds_root_cert"] == ""


@pytest.mark.parametrize(("ips", "dual", "want"), [
    (("10.1.1.1",), False, ("127.0.0.1", "0.0.0.0", "V4_ONLY")),
    (("fd00::1",), False, ("::1", "::", "V6_ONLY")),
    (("10.1.1.1", "fd00::1"), False, ("127.0.0.1", "0.0.0.0", "V4_ONLY")),
    (("fd00::1", "10.1.1.1"), True, ("::1", "::", "ALL")),
])
def test_option_localhost_wildcard_dns_lookup_family(ips: tuple[str, ...], dual: bool,
                                                     want: tuple[str, str, str]) -> None:
    b, p = both(options({"tracing": {"zipkin": {"address": "z:9411"}}}, ips=ips, dual_stack=dual))
    assert (p["localhost"], p["wildcard"], p["dns_lookup_family"]) == want
    assert b["admin"]["address"]["socket_address"]["address"] == want[0]
    assert clusters(b)["zipkin"]["dns_lookup_family"] == want[2]
    assert f"{want[1]}_15021" in listeners(b)


def test_option_dual_stack_additional_localhost_and_wildcard() -> None:
    b, p = both(options(ips=("10.1.1.1", "fd00::1"), dual_stack=True))
    as_envoy_proto(b)
    assert (p["dual_stack"], p["additional_localhost"], p["additional_wildcard"]) == (True, "::1", "::")
    for listener in b["static_resources"]["listeners"]:
        assert listener["additionalAddresses"][0]["address"]["socket_address"]["address"] == "::"
    assert "dual_stack" not in both(options(ips=("10.1.1.1", "fd00::1")))[1]


def test_option_envoy_prometheus_port() -> None:
    b, p = both(options(metadata={"envoy_prometheus_port": 16090}))
    assert p["envoy_prometheus_port"] == 16090
    assert "0.0.0.0_16090" in listeners(b)
    assert b["node"]["metadata"]["ENVOY_PROMETHEUS_PORT"] == 16090


def test_option_envoy_status_port() -> None:
    b, p = both(options(metadata={"envoy_status_port": 16021}))
    assert p["envoy_status_port"] == 16021
    status = listeners(b)["0.0.0.0_16021"]
    assert status["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0][
        "routes"] == [{"match": {"prefix": "/healthz/ready"}, "route": {"cluster": "agent"}}]


def test_option_envoy_status_port_enable_proxy_protocol() -> None:
    b, p = both(options(status_port_proxy_protocol=True))
    as_envoy_proto(b)
    assert p["envoy_status_port_enable_proxy_protocol"] is True
    filters = listeners(b)["0.0.0.0_15021"]["listener_filters"]
    assert filters[0]["name"] == "envoy.listener.proxy_protocol"
    assert filters[0]["typed_config"]["allow_requests_without_proxy_protocol"] is True
    plain, params = both(options())
    assert "listener_filters" not in listeners(plain)["0.0.0.0_15021"]
    assert "envoy_status_port_enable_proxy_protocol" not in params


def test_option_metrics_localhost_access_only() -> None:
    b, p = both(options({"proxyMetadata": {"METRICS_LOCALHOST_ACCESS_ONLY": "true"}}))
    assert p["metrics_localhost_access_only"] is True
    assert "127.0.0.1_15090" in listeners(b) and "0.0.0.0_15021" in listeners(b)
    b, p = both(options(environ={"METRICS_LOCALHOST_ACCESS_ONLY": "true"}))
    assert p["metrics_localhost_access_only"] is False, "upstream reads it from ProxyConfig proxyMetadata"
    assert "0.0.0.0_15090" in listeners(b)


def test_option_secure_metrics_port() -> None:
    b, p = both(options(metadata={"envoy_secure_metrics_port": 15091}))
    as_envoy_proto(b)
    assert p["secure_metrics_port"] == 15091
    assert [item["name"] for item in b["static_resources"]["listeners"]] == [
        "0.0.0.0_15090", "0.0.0.0_15091", "0.0.0.0_15021"]
    secure = listeners(b)["0.0.0.0_15091"]
    chain = secure["filter_chains"][0]
    assert chain["filter_chain_match"] == {"transport_protocol": "tls"}
    tls = chain["transport_socket"]["typed_config"]
    assert tls["require_client_certificate"] is True
    assert tls["common_tls_context"]["tls_certificate_sds_secret_configs"][0]["name"] == "default"
    routes = chain["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    assert routes == [{"match": {"prefix": "/stats/prometheus"}, "route": {"cluster": "prometheus_stats"}}]
    assert b["node"]["metadata"]["ENVOY_SECURE_METRICS_PORT"] == 15091
    assert "secure_metrics_port" not in both(options())[1]


def test_option_secure_merged_metrics_port() -> None:
    b, p = both(options(metadata={"envoy_secure_merged_metrics_port": 15092}))
    as_envoy_proto(b)
    assert p["secure_merged_metrics_port"] == 15092
    manager = listeners(b)["0.0.0.0_15092"]["filter_chains"][0]["filters"][0]["typed_config"]
    assert manager["stat_prefix"] == "secure_merged_stats"
    assert [r["match"]["prefix"] for r in manager["route_config"]["virtual_hosts"][0]["routes"]] == [
        "/stats/prometheus", "/metrics"]
    assert {r["route"]["cluster"] for r in manager["route_config"]["virtual_hosts"][0]["routes"]} == {"agent"}


def test_option_workload_identity_socket_file() -> None:
    b, p = both(options(metadata={"workload_identity_socket_file": "spire.sock"}))
    assert p["workload_identity_socket_file"] == "spire.sock"
    assert endpoint(clusters(b)["sds-grpc"])["pipe"]["path"] == "./var/run/secrets/workload-spiffe-uds/spire.sock"


def test_option_custom_file_path() -> None:
    b, p = both(options(metadata={"custom_credentials_file_exists": True}))
    assert p["custom_file_path"] == "./var/run/secrets/credential-uds/files-socket"
    names = [c["name"] for c in b["static_resources"]["clusters"]]
    assert names.index("sds-files-grpc") == names.index("sds-grpc") + 1
    assert "custom_file_path" not in both(options())[1]


def test_option_enable_self_discovery() -> None:
    b, p = both(options(environ={"ISTIO_META_ENABLE_SELF_DISCOVERY": "true"}))
    as_envoy_proto(b)
    assert p["enable_self_discovery"] is True
    local = clusters(b)["local_cluster"]
    assert local["type"] == "EDS" and local["eds_cluster_config"]["service_name"] == "local_cluster"
    assert b["cluster_manager"]["local_cluster_name"] == "local_cluster"
    plain, params = both(options())
    assert "local_cluster" not in clusters(plain) and "cluster_manager" not in plain
    assert "enable_self_discovery" not in params


def test_option_global_downstream_max_connections() -> None:
    def limit(pc: dict[str, Any]) -> int:
        b, p = both(options(pc))
        value = b["overload_manager"]["resource_monitors"][0]["typed_config"]["max_active_downstream_connections"]
        assert value == p["global_downstream_max_connections"]
        return int(value)

    runtime = {"runtimeValues": {"overload.global_downstream_max_connections": "5000"}}
    meta = {"proxyMetadata": {"ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS": "20000"}}
    settings = {"connectionSettings": {"globalDownstreamConnectionLimit": 15000}}
    assert limit({}) == 2147483647
    assert limit(runtime) == 5000
    assert limit({**runtime, **meta}) == 20000
    assert limit({**runtime, **meta, **settings}) == 15000
    assert limit({**meta, "connectionSettings": {"globalDownstreamConnectionLimit": 0}}) == 20000
    assert limit({"proxyMetadata": {"ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS": " 7"}}) == 2147483647


def test_option_log_json() -> None:
    b, p = both(options(log_as_json=True))
    assert p["log_json"] is True
    assert b["application_log_config"]["log_format"]["json_format"]["msg"] == "%j"
    assert "text_format" in both(options())[0]["application_log_config"]["log_format"]


def test_option_outlier_log_path() -> None:
    b, p = both(options(metadata={"outlier_log_path": "/dev/stdout"}))
    assert p["outlier_log_path"] == "/dev/stdout"
    assert b["cluster_manager"] == {"outlier_detection": {"event_log_path": "/dev/stdout"},
                                    "enable_deferred_cluster_creation": True}


def test_option_sts_and_sts_port() -> None:
    _, p = both(options(metadata={"sts_port": 15463}))
    assert (p["sts"], p["sts_port"]) == (True, 15463)
    assert "sts" not in both(options())[1]


def test_option_gcp_project_id_and_number() -> None:
    """From PLATFORM_METADATA (GCP_METADATA): the number always, the project id only with an STS port."""
    gcp = {"gcp_project": "my-proj", "gcp_project_number": "1234"}
    _, p = both(options(metadata={"sts_port": 15463, "platform_metadata": gcp}))
    assert (p["gcp_project_id"], p["gcp_project_number"]) == ("my-proj", "1234")
    _, p = both(options(metadata={"platform_metadata": gcp}))
    assert "gcp_project_id" not in p and p["gcp_project_number"] == "1234"
    _, p = both(options(metadata={"sts_port": 15463}))
    assert "gcp_project_id" not in p and "gcp_project_number" not in p, "no platform metadata, no GCP options"
