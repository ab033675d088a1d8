"""The type of `istio.mesh.v1alpha1.ProxyConfig`, field by field, for `config.protojson`.

Every field upstream's mesh/v1alpha1/proxy.proto defines at the pinned istio/api
version, with the messages it refers to (ClientTLSSettings, TcpKeepalive and
ReadinessProbe from networking/v1alpha3, ProxyImage from networking/v1beta1),
in declaration order, so that a document is checked as upstream's parser checks
it: a nested `tracing.zipkin.address: 5` or `connectionSettings.profile: HUGE`
is refused there too. `protos/proxyconfig.proto` is the same type for protobuf;
`tests/unit/test_proxyconfig_fields.py` checks the two agree.
"""

from __future__ import annotations

from istio_agent.config.protojson import (
    Enum,
    Message,
    duration,
    enum,
    message,
    message_map,
    repeated,
    scalar,
    string_map,
    wrapper,
)


def _enum(full_name: str, *names: str, numbers: tuple[int, ...] = ()) -> Enum:
    return Enum(full_name, tuple(zip(names, numbers or range(len(names)), strict=True)))


# --- istio.networking.v1alpha3 ------------------------------------------------------------------------
TLS_MODE = _enum("istio.networking.v1alpha3.ClientTLSSettings.TLSmode", "DISABLE", "SIMPLE", "MUTUAL", "ISTIO_MUTUAL")
CLIENT_TLS_SETTINGS = Message("istio.networking.v1alpha3.ClientTLSSettings", (
    enum("mode", TLS_MODE),
    scalar("client_certificate", "string"),
    scalar("private_key", "string"),
    scalar("ca_certificates", "string"),
    scalar("credential_name", "string"),
    repeated("subject_alt_names", "string"),
    scalar("sni", "string"),
    wrapper("insecure_skip_verify", "bool"),
    scalar("ca_crl", "string"),
))
TCP_KEEPALIVE = Message("istio.networking.v1alpha3.ConnectionPoolSettings.TCPSettings.TcpKeepalive", (
    scalar("probes", "uint32"),
    duration("time"),
    duration("interval"),
))
HTTP_HEADER = Message("istio.networking.v1alpha3.HTTPHeader", (scalar("name", "string"), scalar("value", "string")))
HTTP_HEALTH_CHECK = Message("istio.networking.v1alpha3.HTTPHealthCheckConfig", (
    scalar("path", "string"),
    scalar("port", "uint32"),
    scalar("host", "string"),
    scalar("scheme", "string"),
    repeated("http_headers", "message", message=HTTP_HEADER),
))
TCP_HEALTH_CHECK = Message("istio.networking.v1alpha3.TCPHealthCheckConfig", (
    scalar("host", "string"), scalar("port", "uint32"),
))
EXEC_HEALTH_CHECK = Message("istio.networking.v1alpha3.ExecHealthCheckConfig", (repeated("command", "string"),))
GRPC_HEALTH_CHECK = Message("istio.networking.v1alpha3.GrpcHealthCheckConfig", (
    scalar("port", "uint32"), scalar("service", "string"),
))
READINESS_PROBE = Message("istio.networking.v1alpha3.ReadinessProbe", (
    scalar("initial_delay_seconds", "int32"),
    scalar("timeout_seconds", "int32"),
    scalar("period_seconds", "int32"),
    scalar("success_threshold", "int32"),
    scalar("failure_threshold", "int32"),
    message("http_get", HTTP_HEALTH_CHECK, oneof="health_check_method"),
    message("tcp_socket", TCP_HEALTH_CHECK, oneof="health_check_method"),
    message("exec", EXEC_HEALTH_CHECK, oneof="health_check_method"),
    message("grpc", GRPC_HEALTH_CHECK, oneof="health_check_method"),
))

# --- istio.networking.v1beta1 -------------------------------------------------------------------------
PROXY_IMAGE = Message("istio.networking.v1beta1.ProxyImage", (scalar("image_type", "string"),))

# --- istio.mesh.v1alpha1 ------------------------------------------------------------------------------
AUTHENTICATION_POLICY = _enum("istio.mesh.v1alpha1.AuthenticationPolicy", "NONE", "MUTUAL_TLS", "INHERIT",
                              numbers=(0, 1, 1000))
FORWARD_CLIENT_CERT_DETAILS = _enum(
    "istio.mesh.v1alpha1.ForwardClientCertDetails",
    "UNDEFINED", "SANITIZE", "FORWARD_ONLY", "APPEND_FORWARD", "SANITIZE_SET", "ALWAYS_FORWARD_ONLY")

_T = "istio.mesh.v1alpha1.Tracing"
TRACE_CONTEXT = _enum(f"{_T}.OpenCensusAgent.TraceContext",
                      "UNSPECIFIED", "W3C_TRACE_CONTEXT", "GRPC_BIN", "CLOUD_TRACE_CONTEXT", "B3")
ZIPKIN = Message(f"{_T}.Zipkin", (scalar("address", "string"),))
LIGHTSTEP = Message(f"{_T}.Lightstep", (scalar("address", "string"), scalar("access_token", "string")))
DATADOG = Message(f"{_T}.Datadog", (scalar("address", "string"),))
STACKDRIVER = Message(f"{_T}.Stackdriver", (
    scalar("debug", "bool"),
    wrapper("max_number_of_attributes", "int64"),
    wrapper("max_number_of_annotations", "int64"),
    wrapper("max_number_of_message_events", "int64"),
))
OPENCENSUS_AGENT = Message(f"{_T}.OpenCensusAgent", (
    scalar("address", "string"), repeated("context", "enum", enum=TRACE_CONTEXT),
))
_NAME_DEFAULT = (scalar("name", "string"), scalar("default_value", "string"))
CUSTOM_TAG = Message(f"{_T}.CustomTag", (
    message("literal", Message(f"{_T}.Literal", (scalar("value", "string"),)), oneof="type"),
    message("environment", Message(f"{_T}.Environment", _NAME_DEFAULT), oneof="type"),
    message("header", Message(f"{_T}.RequestHeader", _NAME_DEFAULT), oneof="type"),
))
TRACING = Message(_T, (
    message("zipkin", ZIPKIN, oneof="tracer"),
    message("lightstep", LIGHTSTEP, oneof="tracer"),
    message("datadog", DATADOG, oneof="tracer"),
    message("stackdriver", STACKDRIVER, oneof="tracer"),
    message("open_census_agent", OPENCENSUS_AGENT, oneof="tracer"),
    message_map("custom_tags", CUSTOM_TAG),
    scalar("max_path_tag_length", "uint32"),
    scalar("sampling", "double"),
    message("tls_settings", CLIENT_TLS_SETTINGS),
    wrapper("enable_istio_tags", "bool"),
))
SDS = Message("istio.mesh.v1alpha1.SDS", (scalar("enabled", "bool"), scalar("k8s_sa_jwt_path", "string")))
TOPOLOGY = Message("istio.mesh.v1alpha1.Topology", (
    scalar("num_trusted_proxies", "uint32"),
    enum("forward_client_cert_details", FORWARD_CLIENT_CERT_DETAILS),
    message("proxy_protocol", Message("istio.mesh.v1alpha1.Topology.ProxyProtocolConfiguration")),
))
_POLL = (duration("poll_delay"), wrapper("fallback", "bool"))
PRIVATE_KEY_PROVIDER = Message("istio.mesh.v1alpha1.PrivateKeyProvider", (
    message("cryptomb", Message("istio.mesh.v1alpha1.PrivateKeyProvider.CryptoMb", _POLL), oneof="provider"),
    message("qat", Message("istio.mesh.v1alpha1.PrivateKeyProvider.QAT", _POLL), oneof="provider"),
))
REMOTE_SERVICE = Message("istio.mesh.v1alpha1.RemoteService", (
    scalar("address", "string"),
    message("tls_settings", CLIENT_TLS_SETTINGS),
    message("tcp_keepalive", TCP_KEEPALIVE),
))

_PC = "istio.mesh.v1alpha1.ProxyConfig"
TRACING_SERVICE_NAME = _enum(f"{_PC}.TracingServiceName",
                             "APP_LABEL_AND_NAMESPACE", "CANONICAL_NAME_ONLY", "CANONICAL_NAME_AND_NAMESPACE")
INBOUND_INTERCEPTION_MODE = _enum(f"{_PC}.InboundInterceptionMode", "REDIRECT", "TPROXY", "NONE")
PROXY_STATS_MATCHER = Message(f"{_PC}.ProxyStatsMatcher", (
    repeated("inclusion_prefixes", "string"),
    repeated("inclusion_suffixes", "string"),
    repeated("inclusion_regexps", "string"),
))

_PH = f"{_PC}.ProxyHeaders"
_DISABLED = (wrapper("disabled", "bool"),)
_ENABLED = (wrapper("enabled", "bool"),)
METADATA_EXCHANGE_MODE = _enum(f"{_PH}.MetadataExchangeMode", "UNDEFINED", "IN_MESH")
PROXY_HEADERS = Message(_PH, (
    enum("forwarded_client_cert", FORWARD_CLIENT_CERT_DETAILS),
    message("set_current_client_cert_details", Message(f"{_PH}.SetCurrentClientCertDetails", tuple(
        wrapper(name, "bool") for name in ("subject", "cert", "chain", "dns", "uri")))),
    message("request_id", Message(f"{_PH}.RequestId", _DISABLED)),
    message("server", Message(f"{_PH}.Server", (wrapper("disabled", "bool"), scalar("value", "string")))),
    message("attempt_count", Message(f"{_PH}.AttemptCount", _DISABLED)),
    message("envoy_debug_headers", Message(f"{_PH}.EnvoyDebugHeaders", _DISABLED)),
    message("metadata_exchange_headers", Message(f"{_PH}.MetadataExchangeHeaders", (
        enum("mode", METADATA_EXCHANGE_MODE),))),
    wrapper("preserve_http1_header_case", "bool"),
    message("x_forwarded_host", Message(f"{_PH}.XForwardedHost", _ENABLED)),
    message("x_forwarded_port", Message(f"{_PH}.XForwardedPort", _ENABLED)),
))

_CS = f"{_PC}.ConnectionSettings"
CONNECTION_PROFILE = _enum(f"{_CS}.Profile", "SIDECAR", "EDGE")
HEADERS_WITH_UNDERSCORES_ACTION = _enum(
    f"{_CS}.HeadersWithUnderscoresAction", "HEADERS_WITH_UNDERSCORES_UNSPECIFIED", "HEADERS_WITH_UNDERSCORES_ALLOW",
    "HEADERS_WITH_UNDERSCORES_REJECT_REQUEST", "HEADERS_WITH_UNDERSCORES_DROP_HEADER")
PATH_WITH_ESCAPED_SLASHES_ACTION = _enum(
    f"{_CS}.PathWithEscapedSlashesAction", "PATH_WITH_ESCAPED_SLASHES_UNSPECIFIED", "KEEP_UNCHANGED",
    "REJECT_REQUEST", "UNESCAPE_AND_REDIRECT", "UNESCAPE_AND_FORWARD")
CONNECTION_SETTINGS = Message(_CS, (
    enum("profile", CONNECTION_PROFILE),
    wrapper("listener_per_connection_buffer_limit_bytes", "int32"),
    wrapper("cluster_per_connection_buffer_limit_bytes", "int32"),
    duration("http_idle_timeout"),
    duration("http_max_connection_duration"),
    duration("http_drain_timeout"),
    duration("http_request_timeout"),
    duration("http_request_headers_timeout"),
    duration("http_stream_idle_timeout"),
    duration("http_max_stream_duration"),
    wrapper("http_max_concurrent_streams", "int32"),
    wrapper("http2_initial_stream_window_size", "int32"),
    wrapper("http2_initial_connection_window_size", "int32"),
    enum("http_headers_with_underscores_action", HEADERS_WITH_UNDERSCORES_ACTION),
    wrapper("http_merge_slashes", "bool"),
    enum("http_path_with_escaped_slashes_action", PATH_WITH_ESCAPED_SLASHES_ACTION),
    wrapper("listener_connection_limit", "int32"),
    wrapper("global_downstream_connection_limit", "int32"),
))

PROXY_CONFIG = Message(_PC, (
    scalar("config_path", "string"),
    scalar("binary_path", "string"),
    scalar("service_cluster", "string", oneof="cluster_name"),
    enum("tracing_service_name", TRACING_SERVICE_NAME, oneof="cluster_name"),
    duration("drain_duration"),
    scalar("discovery_address", "string"),
    duration("discovery_refresh_delay"),
    scalar("zipkin_address", "string"),
    scalar("statsd_udp_address", "string"),
    scalar("envoy_metrics_service_address", "string"),
    scalar("proxy_admin_port", "int32"),
    scalar("availability_zone", "string"),
    enum("control_plane_auth_policy", AUTHENTICATION_POLICY),
    scalar("custom_config_file", "string"),
    scalar("stat_name_length", "int32"),
    wrapper("concurrency", "int32"),
    scalar("proxy_bootstrap_template_path", "string"),
    enum("interception_mode", INBOUND_INTERCEPTION_MODE),
    message("tracing", TRACING),
    message("sds", SDS),
    message("envoy_access_log_service", REMOTE_SERVICE),
    message("envoy_metrics_service", REMOTE_SERVICE),
    string_map("proxy_metadata"),
    string_map("runtime_values"),
    scalar("status_port", "int32"),
    repeated("extra_stat_tags", "string"),
    message("gateway_topology", TOPOLOGY),
    duration("termination_drain_duration"),
    scalar("mesh_id", "string"),
    message("readiness_probe", READINESS_PROBE),
    message("proxy_stats_matcher", PROXY_STATS_MATCHER),
    wrapper("hold_application_until_proxy_starts", "bool"),
    repeated("ca_certificates_pem", "string"),
    message("image", PROXY_IMAGE),
    message("private_key_provider", PRIVATE_KEY_PROVIDER),
    message("proxy_headers", PROXY_HEADERS),
    duration("file_flush_interval"),
    scalar("file_flush_min_size_kb", "uint32"),
    wrapper("stats_compression", "bool"),
    message("connection_settings", CONNECTION_SETTINGS),
))

# Names upstream retired (reserved in the .proto); a document that still sets them is read as upstream
# does, by dropping them with the unknown-field warning.
RETIRED_FIELDS = ("parentShutdownDuration", "parent_shutdown_duration", "connectTimeout", "connect_timeout")
