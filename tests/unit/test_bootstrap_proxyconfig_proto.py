"""The ProxyConfig proto must carry upstream's names and numbers: PCDS and the kit's text files depend on them."""

from __future__ import annotations

from google.protobuf import json_format, text_format

from istio_agent.protos import networking_pb2, proxyconfig_pb2


def test_upstream_names_and_field_numbers() -> None:
    pc = proxyconfig_pb2.ProxyConfig.DESCRIPTOR
    assert pc.full_name == "istio.mesh.v1alpha1.ProxyConfig"
    numbers = {f.name: f.number for f in pc.fields}
    assert numbers["config_path"] == 1
    assert numbers["service_cluster"] == 3
    assert numbers["tracing_service_name"] == 36
    assert numbers["drain_duration"] == 4
    assert numbers["discovery_address"] == 6
    assert numbers["statsd_udp_address"] == 10
    assert numbers["proxy_admin_port"] == 11
    assert numbers["control_plane_auth_policy"] == 13
    assert numbers["custom_config_file"] == 14
    assert numbers["concurrency"] == 16
    assert numbers["proxy_bootstrap_template_path"] == 17
    assert numbers["tracing"] == 19
    assert numbers["envoy_metrics_service"] == 23
    assert numbers["proxy_metadata"] == 24
    assert numbers["status_port"] == 26
    assert numbers["extra_stat_tags"] == 27
    assert numbers["termination_drain_duration"] == 29
    assert numbers["proxy_stats_matcher"] == 32
    assert numbers["ca_certificates_pem"] == 34
    assert numbers["runtime_values"] == 37
    tls = networking_pb2.ClientTLSSettings.DESCRIPTOR
    assert tls.full_name == "istio.networking.v1alpha3.ClientTLSSettings"
    assert {f.name: f.number for f in tls.fields}["sni"] == 6


def test_text_format_to_protojson() -> None:
    text = (
        'drain_duration: {seconds: 2}\ncontrol_plane_auth_policy: MUTUAL_TLS\n'
        'tracing: { zipkin: { address: "z:9411" } }\n'
    )
    msg = text_format.Parse(text, proxyconfig_pb2.ProxyConfig())
    assert json_format.MessageToDict(msg) == {
        "drainDuration": "2s", "controlPlaneAuthPolicy": "MUTUAL_TLS", "tracing": {"zipkin": {"address": "z:9411"}},
    }
