"""The ProxyConfig type exists twice: as a .proto (for PCDS and the kit's text files) and as the table the
config parser checks documents against. They must describe the same message, field for field."""

from __future__ import annotations

import pytest
from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from istio_agent.config import protojson
from istio_agent.config.errors import ConfigError
from istio_agent.config.proxyconfig import build_proxy_config, parse_layer
from istio_agent.config.proxyconfig_fields import PROXY_CONFIG
from istio_agent.protos import proxyconfig_pb2

_WRAPPERS = {
    "google.protobuf.BoolValue": "bool", "google.protobuf.Int32Value": "int32", "google.protobuf.UInt32Value": "uint32",
    "google.protobuf.Int64Value": "int64", "google.protobuf.UInt64Value": "uint64",
    "google.protobuf.DoubleValue": "double", "google.protobuf.StringValue": "string",
}
_SCALARS = {
    FieldDescriptor.TYPE_STRING: "string", FieldDescriptor.TYPE_BOOL: "bool", FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_UINT32: "uint32", FieldDescriptor.TYPE_INT64: "int64", FieldDescriptor.TYPE_UINT64: "uint64",
    FieldDescriptor.TYPE_DOUBLE: "double", FieldDescriptor.TYPE_FLOAT: "float", FieldDescriptor.TYPE_BYTES: "bytes",
}


def _same(table: protojson.Message, desc: Descriptor, path: str) -> None:
    assert table.full_name == desc.full_name, path
    assert [f.name for f in table.fields] == [f.name for f in desc.fields], path
    for spec, fd in zip(table.fields, desc.fields, strict=True):
        where = f"{path}.{fd.name}"
        assert spec.json_name == fd.json_name, where
        assert spec.oneof == (fd.containing_oneof.name if fd.containing_oneof else ""), where
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            assert spec.map_of is not None, where
            value = fd.message_type.fields_by_name["value"]
            if value.message_type is not None:
                assert spec.map_of.message is not None
                _same(spec.map_of.message, value.message_type, where)
            else:
                assert spec.map_of.kind == _SCALARS[value.type], where
            continue
        assert spec.repeated == fd.is_repeated, where
        if fd.message_type is not None:
            name = fd.message_type.full_name
            if name == "google.protobuf.Duration":
                assert spec.kind == "duration", where
            elif name in _WRAPPERS:
                assert (spec.kind, spec.wraps) == ("wrapper", _WRAPPERS[name]), where
            else:
                assert spec.kind == "message" and spec.message is not None, where
                _same(spec.message, fd.message_type, where)
        elif fd.enum_type is not None:
            assert spec.kind == "enum" and spec.enum is not None, where
            assert spec.enum.full_name == fd.enum_type.full_name, where
            assert spec.enum.values == tuple((v.name, v.number) for v in fd.enum_type.values), where
        else:
            assert spec.kind == _SCALARS[fd.type], where


def test_table_and_proto_describe_the_same_message() -> None:
    _same(PROXY_CONFIG, proxyconfig_pb2.ProxyConfig.DESCRIPTOR, "ProxyConfig")


def test_reserved_upstream_numbers_stay_free() -> None:
    numbers = {f.number for f in proxyconfig_pb2.ProxyConfig.DESCRIPTOR.fields}
    assert not numbers & {5, 9, 25}
    assert {f.name: f.number for f in proxyconfig_pb2.ProxyConfig.DESCRIPTOR.fields}["connection_settings"] == 43


FULL_TEXT = """
config_path: "/etc/istio/proxy" binary_path: "/usr/local/bin/envoy" tracing_service_name: CANONICAL_NAME_ONLY
drain_duration { seconds: 2 nanos: 500000000 } discovery_address: "istiod:15012" proxy_admin_port: 15000
control_plane_auth_policy: MUTUAL_TLS concurrency { value: 0 } interception_mode: TPROXY
tracing { stackdriver { debug: true max_number_of_attributes { value: 200 } } sampling: 12.5
          custom_tags { key: "k" value { environment { name: "E" default_value: "d" } } }
          tls_settings { mode: ISTIO_MUTUAL subject_alt_names: "a" } enable_istio_tags { value: false } }
envoy_metrics_service { address: "m:1" tcp_keepalive { probes: 3 time { seconds: 10 } } }
proxy_metadata { key: "A" value: "1" } runtime_values { key: "r" value: "" } status_port: 15020
extra_stat_tags: "t" gateway_topology { num_trusted_proxies: 2 forward_client_cert_details: SANITIZE_SET
                                        proxy_protocol {} }
readiness_probe { period_seconds: 5 http_get { path: "/" port: 8080 http_headers { name: "h" value: "v" } } }
proxy_stats_matcher { inclusion_regexps: ".*" } hold_application_until_proxy_starts { value: true }
image { image_type: "distroless" } private_key_provider { qat { poll_delay { seconds: 1 } } }
proxy_headers { forwarded_client_cert: APPEND_FORWARD server { disabled { value: true } }
                metadata_exchange_headers { mode: IN_MESH } preserve_http1_header_case { value: true } }
file_flush_interval { nanos: 100000000 } file_flush_min_size_kb: 64 stats_compression { value: false }
connection_settings { profile: EDGE http_idle_timeout { seconds: 60 } http_merge_slashes { value: true }
                      http_path_with_escaped_slashes_action: UNESCAPE_AND_REDIRECT
                      global_downstream_connection_limit { value: 1000 } }
"""


def test_every_field_upstreams_marshaller_writes_reads_back_unchanged() -> None:
    """protobuf's own JSON of a ProxyConfig using every kind of field is accepted and kept as it was written."""
    message = text_format.Parse(FULL_TEXT, proxyconfig_pb2.ProxyConfig())
    written = json_format.MessageToDict(message)
    values = parse_layer(written, "test")
    assert values.pop("drainDuration") == 2.5
    assert values.pop("fileFlushInterval") == pytest.approx(0.1)
    written.pop("drainDuration")
    written.pop("fileFlushInterval")
    assert values == written


@pytest.mark.parametrize(("layer", "needle"), [
    ({"tracing": {"zipkin": {"address": 5}}}, "field tracing.zipkin.address: expected a string"),
    ({"connectionSettings": {"profile": "HUGE"}}, "'HUGE' is not one of SIDECAR, EDGE"),
    ({"connectionSettings": {"globalDownstreamConnectionLimit": 1.5}}, "globalDownstreamConnectionLimit"),
    ({"envoyMetricsService": {"tcpKeepalive": {"time": 30}}}, "envoyMetricsService.tcpKeepalive.time"),
    ({"proxyMetadata": {"ISTIO_META_DNS_CAPTURE": True}}, 'quote it: "true"'),
    ({"statsCompression": "false"}, "field statsCompression: expected true or false"),
    ({"readinessProbe": {"httpGet": {"port": -1}}}, "readinessProbe.httpGet.port"),
    ({"extraStatTags": "a,b"}, "field extraStatTags: expected a list"),
    ({"tracing": {"sampling": "lots"}}, "field tracing.sampling: expected a number"),
    ({"concurrency": 2**31}, "out of range for int32"),
])
def test_nested_values_are_checked_as_upstream_parses_them(layer: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=r"^PROXY_CONFIG: ") as info:
        parse_layer(layer, "PROXY_CONFIG")
    assert needle in str(info.value)


def test_nested_unknown_fields_are_dropped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    values = parse_layer({"tracing": {"zipkin": {"address": "z:9411", "port": 1}, "sampling": 1}}, "mesh")
    assert values == {"tracing": {"zipkin": {"address": "z:9411"}, "sampling": 1.0}}
    assert "tracing.zipkin.port" in caplog.text


def test_last_oneof_member_in_declaration_order_wins(caplog: pytest.LogCaptureFixture) -> None:
    values = parse_layer({"tracing": {"datadog": {"address": "d:1"}, "zipkin": {"address": "z:1"}}}, "mesh")
    assert values["tracing"] == {"datadog": {"address": "d:1"}}
    assert "both set" in caplog.text


def test_nested_zero_values_are_left_out_and_64_bit_integers_are_strings() -> None:
    values = parse_layer({"tracing": {"sampling": 0, "maxPathTagLength": 0, "stackdriver": {
        "debug": False, "maxNumberOfAttributes": 7}}}, "mesh")
    assert values["tracing"] == {"stackdriver": {"maxNumberOfAttributes": "7"}}


def test_a_later_proxy_headers_keeps_the_header_settings_it_leaves_unset() -> None:
    config = build_proxy_config(
        "defaultConfig:\n  proxyHeaders: {forwardedClientCert: SANITIZE, server: {value: s}, "
        "attemptCount: {disabled: true}, preserveHttp1HeaderCase: true}\n",
        '{"proxyHeaders": {"requestId": {"disabled": true}, "attemptCount": {"disabled": false}}}', {})
    assert config.get("proxyHeaders") == {
        "requestId": {"disabled": True}, "attemptCount": {"disabled": False},
        "forwardedClientCert": "SANITIZE", "server": {"value": "s"},
    }, "preserveHttp1HeaderCase is not among the kept settings"
