import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import wrappers_pb2 as _wrappers_pb2
from istio_agent.protos import networking_pb2 as _networking_pb2
from istio_agent.protos import networking_v1beta1_pb2 as _networking_v1beta1_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AuthenticationPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NONE: _ClassVar[AuthenticationPolicy]
    MUTUAL_TLS: _ClassVar[AuthenticationPolicy]
    INHERIT: _ClassVar[AuthenticationPolicy]

class ForwardClientCertDetails(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNDEFINED: _ClassVar[ForwardClientCertDetails]
    SANITIZE: _ClassVar[ForwardClientCertDetails]
    FORWARD_ONLY: _ClassVar[ForwardClientCertDetails]
    APPEND_FORWARD: _ClassVar[ForwardClientCertDetails]
    SANITIZE_SET: _ClassVar[ForwardClientCertDetails]
    ALWAYS_FORWARD_ONLY: _ClassVar[ForwardClientCertDetails]
NONE: AuthenticationPolicy
MUTUAL_TLS: AuthenticationPolicy
INHERIT: AuthenticationPolicy
UNDEFINED: ForwardClientCertDetails
SANITIZE: ForwardClientCertDetails
FORWARD_ONLY: ForwardClientCertDetails
APPEND_FORWARD: ForwardClientCertDetails
SANITIZE_SET: ForwardClientCertDetails
ALWAYS_FORWARD_ONLY: ForwardClientCertDetails

class Tracing(_message.Message):
    __slots__ = ("zipkin", "lightstep", "datadog", "stackdriver", "open_census_agent", "custom_tags", "max_path_tag_length", "sampling", "tls_settings", "enable_istio_tags")
    class Zipkin(_message.Message):
        __slots__ = ("address",)
        ADDRESS_FIELD_NUMBER: _ClassVar[int]
        address: str
        def __init__(self, address: _Optional[str] = ...) -> None: ...
    class Lightstep(_message.Message):
        __slots__ = ("address", "access_token")
        ADDRESS_FIELD_NUMBER: _ClassVar[int]
        ACCESS_TOKEN_FIELD_NUMBER: _ClassVar[int]
        address: str
        access_token: str
        def __init__(self, address: _Optional[str] = ..., access_token: _Optional[str] = ...) -> None: ...
    class Datadog(_message.Message):
        __slots__ = ("address",)
        ADDRESS_FIELD_NUMBER: _ClassVar[int]
        address: str
        def __init__(self, address: _Optional[str] = ...) -> None: ...
    class Stackdriver(_message.Message):
        __slots__ = ("debug", "max_number_of_attributes", "max_number_of_annotations", "max_number_of_message_events")
        DEBUG_FIELD_NUMBER: _ClassVar[int]
        MAX_NUMBER_OF_ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
        MAX_NUMBER_OF_ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
        MAX_NUMBER_OF_MESSAGE_EVENTS_FIELD_NUMBER: _ClassVar[int]
        debug: bool
        max_number_of_attributes: _wrappers_pb2.Int64Value
        max_number_of_annotations: _wrappers_pb2.Int64Value
        max_number_of_message_events: _wrappers_pb2.Int64Value
        def __init__(self, debug: _Optional[bool] = ..., max_number_of_attributes: _Optional[_Union[_wrappers_pb2.Int64Value, _Mapping]] = ..., max_number_of_annotations: _Optional[_Union[_wrappers_pb2.Int64Value, _Mapping]] = ..., max_number_of_message_events: _Optional[_Union[_wrappers_pb2.Int64Value, _Mapping]] = ...) -> None: ...
    class OpenCensusAgent(_message.Message):
        __slots__ = ("address", "context")
        class TraceContext(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
            __slots__ = ()
            UNSPECIFIED: _ClassVar[Tracing.OpenCensusAgent.TraceContext]
            W3C_TRACE_CONTEXT: _ClassVar[Tracing.OpenCensusAgent.TraceContext]
            GRPC_BIN: _ClassVar[Tracing.OpenCensusAgent.TraceContext]
            CLOUD_TRACE_CONTEXT: _ClassVar[Tracing.OpenCensusAgent.TraceContext]
            B3: _ClassVar[Tracing.OpenCensusAgent.TraceContext]
        UNSPECIFIED: Tracing.OpenCensusAgent.TraceContext
        W3C_TRACE_CONTEXT: Tracing.OpenCensusAgent.TraceContext
        GRPC_BIN: Tracing.OpenCensusAgent.TraceContext
        CLOUD_TRACE_CONTEXT: Tracing.OpenCensusAgent.TraceContext
        B3: Tracing.OpenCensusAgent.TraceContext
        ADDRESS_FIELD_NUMBER: _ClassVar[int]
        CONTEXT_FIELD_NUMBER: _ClassVar[int]
        address: str
        context: _containers.RepeatedScalarFieldContainer[Tracing.OpenCensusAgent.TraceContext]
        def __init__(self, address: _Optional[str] = ..., context: _Optional[_Iterable[_Union[Tracing.OpenCensusAgent.TraceContext, str]]] = ...) -> None: ...
    class CustomTag(_message.Message):
        __slots__ = ("literal", "environment", "header")
        LITERAL_FIELD_NUMBER: _ClassVar[int]
        ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
        HEADER_FIELD_NUMBER: _ClassVar[int]
        literal: Tracing.Literal
        environment: Tracing.Environment
        header: Tracing.RequestHeader
        def __init__(self, literal: _Optional[_Union[Tracing.Literal, _Mapping]] = ..., environment: _Optional[_Union[Tracing.Environment, _Mapping]] = ..., header: _Optional[_Union[Tracing.RequestHeader, _Mapping]] = ...) -> None: ...
    class Literal(_message.Message):
        __slots__ = ("value",)
        VALUE_FIELD_NUMBER: _ClassVar[int]
        value: str
        def __init__(self, value: _Optional[str] = ...) -> None: ...
    class Environment(_message.Message):
        __slots__ = ("name", "default_value")
        NAME_FIELD_NUMBER: _ClassVar[int]
        DEFAULT_VALUE_FIELD_NUMBER: _ClassVar[int]
        name: str
        default_value: str
        def __init__(self, name: _Optional[str] = ..., default_value: _Optional[str] = ...) -> None: ...
    class RequestHeader(_message.Message):
        __slots__ = ("name", "default_value")
        NAME_FIELD_NUMBER: _ClassVar[int]
        DEFAULT_VALUE_FIELD_NUMBER: _ClassVar[int]
        name: str
        default_value: str
        def __init__(self, name: _Optional[str] = ..., default_value: _Optional[str] = ...) -> None: ...
    class CustomTagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tracing.CustomTag
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tracing.CustomTag, _Mapping]] = ...) -> None: ...
    ZIPKIN_FIELD_NUMBER: _ClassVar[int]
    LIGHTSTEP_FIELD_NUMBER: _ClassVar[int]
    DATADOG_FIELD_NUMBER: _ClassVar[int]
    STACKDRIVER_FIELD_NUMBER: _ClassVar[int]
    OPEN_CENSUS_AGENT_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_TAGS_FIELD_NUMBER: _ClassVar[int]
    MAX_PATH_TAG_LENGTH_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TLS_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    ENABLE_ISTIO_TAGS_FIELD_NUMBER: _ClassVar[int]
    zipkin: Tracing.Zipkin
    lightstep: Tracing.Lightstep
    datadog: Tracing.Datadog
    stackdriver: Tracing.Stackdriver
    open_census_agent: Tracing.OpenCensusAgent
    custom_tags: _containers.MessageMap[str, Tracing.CustomTag]
    max_path_tag_length: int
    sampling: float
    tls_settings: _networking_pb2.ClientTLSSettings
    enable_istio_tags: _wrappers_pb2.BoolValue
    def __init__(self, zipkin: _Optional[_Union[Tracing.Zipkin, _Mapping]] = ..., lightstep: _Optional[_Union[Tracing.Lightstep, _Mapping]] = ..., datadog: _Optional[_Union[Tracing.Datadog, _Mapping]] = ..., stackdriver: _Optional[_Union[Tracing.Stackdriver, _Mapping]] = ..., open_census_agent: _Optional[_Union[Tracing.OpenCensusAgent, _Mapping]] = ..., custom_tags: _Optional[_Mapping[str, Tracing.CustomTag]] = ..., max_path_tag_length: _Optional[int] = ..., sampling: _Optional[float] = ..., tls_settings: _Optional[_Union[_networking_pb2.ClientTLSSettings, _Mapping]] = ..., enable_istio_tags: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ...) -> None: ...

class SDS(_message.Message):
    __slots__ = ("enabled", "k8s_sa_jwt_path")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    K8S_SA_JWT_PATH_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    k8s_sa_jwt_path: str
    def __init__(self, enabled: _Optional[bool] = ..., k8s_sa_jwt_path: _Optional[str] = ...) -> None: ...

class Topology(_message.Message):
    __slots__ = ("num_trusted_proxies", "forward_client_cert_details", "proxy_protocol")
    class ProxyProtocolConfiguration(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    NUM_TRUSTED_PROXIES_FIELD_NUMBER: _ClassVar[int]
    FORWARD_CLIENT_CERT_DETAILS_FIELD_NUMBER: _ClassVar[int]
    PROXY_PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    num_trusted_proxies: int
    forward_client_cert_details: ForwardClientCertDetails
    proxy_protocol: Topology.ProxyProtocolConfiguration
    def __init__(self, num_trusted_proxies: _Optional[int] = ..., forward_client_cert_details: _Optional[_Union[ForwardClientCertDetails, str]] = ..., proxy_protocol: _Optional[_Union[Topology.ProxyProtocolConfiguration, _Mapping]] = ...) -> None: ...

class PrivateKeyProvider(_message.Message):
    __slots__ = ("cryptomb", "qat")
    class CryptoMb(_message.Message):
        __slots__ = ("poll_delay", "fallback")
        POLL_DELAY_FIELD_NUMBER: _ClassVar[int]
        FALLBACK_FIELD_NUMBER: _ClassVar[int]
        poll_delay: _duration_pb2.Duration
        fallback: _wrappers_pb2.BoolValue
        def __init__(self, poll_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., fallback: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ...) -> None: ...
    class QAT(_message.Message):
        __slots__ = ("poll_delay", "fallback")
        POLL_DELAY_FIELD_NUMBER: _ClassVar[int]
        FALLBACK_FIELD_NUMBER: _ClassVar[int]
        poll_delay: _duration_pb2.Duration
        fallback: _wrappers_pb2.BoolValue
        def __init__(self, poll_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., fallback: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ...) -> None: ...
    CRYPTOMB_FIELD_NUMBER: _ClassVar[int]
    QAT_FIELD_NUMBER: _ClassVar[int]
    cryptomb: PrivateKeyProvider.CryptoMb
    qat: PrivateKeyProvider.QAT
    def __init__(self, cryptomb: _Optional[_Union[PrivateKeyProvider.CryptoMb, _Mapping]] = ..., qat: _Optional[_Union[PrivateKeyProvider.QAT, _Mapping]] = ...) -> None: ...

class ProxyConfig(_message.Message):
    __slots__ = ("config_path", "binary_path", "service_cluster", "tracing_service_name", "drain_duration", "discovery_address", "discovery_refresh_delay", "zipkin_address", "statsd_udp_address", "envoy_metrics_service_address", "proxy_admin_port", "availability_zone", "control_plane_auth_policy", "custom_config_file", "stat_name_length", "concurrency", "proxy_bootstrap_template_path", "interception_mode", "tracing", "sds", "envoy_access_log_service", "envoy_metrics_service", "proxy_metadata", "runtime_values", "status_port", "extra_stat_tags", "gateway_topology", "termination_drain_duration", "mesh_id", "readiness_probe", "proxy_stats_matcher", "hold_application_until_proxy_starts", "ca_certificates_pem", "image", "private_key_provider", "proxy_headers", "file_flush_interval", "file_flush_min_size_kb", "stats_compression", "connection_settings")
    class TracingServiceName(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        APP_LABEL_AND_NAMESPACE: _ClassVar[ProxyConfig.TracingServiceName]
        CANONICAL_NAME_ONLY: _ClassVar[ProxyConfig.TracingServiceName]
        CANONICAL_NAME_AND_NAMESPACE: _ClassVar[ProxyConfig.TracingServiceName]
    APP_LABEL_AND_NAMESPACE: ProxyConfig.TracingServiceName
    CANONICAL_NAME_ONLY: ProxyConfig.TracingServiceName
    CANONICAL_NAME_AND_NAMESPACE: ProxyConfig.TracingServiceName
    class InboundInterceptionMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        REDIRECT: _ClassVar[ProxyConfig.InboundInterceptionMode]
        TPROXY: _ClassVar[ProxyConfig.InboundInterceptionMode]
        NONE: _ClassVar[ProxyConfig.InboundInterceptionMode]
    REDIRECT: ProxyConfig.InboundInterceptionMode
    TPROXY: ProxyConfig.InboundInterceptionMode
    NONE: ProxyConfig.InboundInterceptionMode
    class ProxyMetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class RuntimeValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class ProxyStatsMatcher(_message.Message):
        __slots__ = ("inclusion_prefixes", "inclusion_suffixes", "inclusion_regexps")
        INCLUSION_PREFIXES_FIELD_NUMBER: _ClassVar[int]
        INCLUSION_SUFFIXES_FIELD_NUMBER: _ClassVar[int]
        INCLUSION_REGEXPS_FIELD_NUMBER: _ClassVar[int]
        inclusion_prefixes: _containers.RepeatedScalarFieldContainer[str]
        inclusion_suffixes: _containers.RepeatedScalarFieldContainer[str]
        inclusion_regexps: _containers.RepeatedScalarFieldContainer[str]
        def __init__(self, inclusion_prefixes: _Optional[_Iterable[str]] = ..., inclusion_suffixes: _Optional[_Iterable[str]] = ..., inclusion_regexps: _Optional[_Iterable[str]] = ...) -> None: ...
    class ProxyHeaders(_message.Message):
        __slots__ = ("forwarded_client_cert", "set_current_client_cert_details", "request_id", "server", "attempt_count", "envoy_debug_headers", "metadata_exchange_headers", "preserve_http1_header_case", "x_forwarded_host", "x_forwarded_port")
        class MetadataExchangeMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
            __slots__ = ()
            UNDEFINED: _ClassVar[ProxyConfig.ProxyHeaders.MetadataExchangeMode]
            IN_MESH: _ClassVar[ProxyConfig.ProxyHeaders.MetadataExchangeMode]
        UNDEFINED: ProxyConfig.ProxyHeaders.MetadataExchangeMode
        IN_MESH: ProxyConfig.ProxyHeaders.MetadataExchangeMode
        class Server(_message.Message):
            __slots__ = ("disabled", "value")
            DISABLED_FIELD_NUMBER: _ClassVar[int]
            VALUE_FIELD_NUMBER: _ClassVar[int]
            disabled: _wrappers_pb2.BoolValue
            value: str
            def __init__(self, disabled: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ..., value: _Optional[str] = ...) -> None: ...
        class RequestId(_message.Message):
            __slots__ = ("disabled",)
            DISABLED_FIELD_NUMBER: _ClassVar[int]
            disabled: _wrappers_pb2.BoolValue
            def __init__(self, disabled: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ...) -> None: ...
        class AttemptCount(_message.Message):
            __slots__ = ("disabled",)
            DISABLED_FIELD_NUMBER: _ClassVar[int]
            disabled: _wrappers_pb2.BoolValue
            def __init__(self, disabled: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ...) -> None: ...
        class XForwardedHost(_message.Message):
            __slots__ = ("enabled",)
            ENABLED_FIELD_NUMBER: _ClassVar[int]
            enabled: _wrappers_pb2.BoolValue
            def __init__(self, enabled: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ...) -> None: ...
        class XForwardedPort(_message.Message):
            __slots__ = ("enabled",)
            ENABLED_FIELD_NUMBER: _ClassVar[int]
            enabled: _wrappers_pb2.BoolValue
            def __init__(self, enabled: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ...) -> None: ...
        class EnvoyDebugHeaders(_message.Message):
            __slots__ = ("disabled",)
            DISABLED_FIELD_NUMBER: _ClassVar[int]
            disabled: _wrappers_pb2.BoolValue
            def __init__(self, disabled: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ...) -> None: ...
        class MetadataExchangeHeaders(_message.Message):
            __slots__ = ("mode",)
            MODE_FIELD_NUMBER: _ClassVar[int]
            mode: ProxyConfig.ProxyHeaders.MetadataExchangeMode
            def __init__(self, mode: _Optional[_Union[ProxyConfig.ProxyHeaders.MetadataExchangeMode, str]] = ...) -> None: ...
        class SetCurrentClientCertDetails(_message.Message):
            __slots__ = ("subject", "cert", "chain", "dns", "uri")
            SUBJECT_FIELD_NUMBER: _ClassVar[int]
            CERT_FIELD_NUMBER: _ClassVar[int]
            CHAIN_FIELD_NUMBER: _ClassVar[int]
            DNS_FIELD_NUMBER: _ClassVar[int]
            URI_FIELD_NUMBER: _ClassVar[int]
            subject: _wrappers_pb2.BoolValue
            cert: _wrappers_pb2.BoolValue
            chain: _wrappers_pb2.BoolValue
            dns: _wrappers_pb2.BoolValue
            uri: _wrappers_pb2.BoolValue
            def __init__(self, subject: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ..., cert: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ..., chain: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ..., dns: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ..., uri: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ...) -> None: ...
        FORWARDED_CLIENT_CERT_FIELD_NUMBER: _ClassVar[int]
        SET_CURRENT_CLIENT_CERT_DETAILS_FIELD_NUMBER: _ClassVar[int]
        REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
        SERVER_FIELD_NUMBER: _ClassVar[int]
        ATTEMPT_COUNT_FIELD_NUMBER: _ClassVar[int]
        ENVOY_DEBUG_HEADERS_FIELD_NUMBER: _ClassVar[int]
        METADATA_EXCHANGE_HEADERS_FIELD_NUMBER: _ClassVar[int]
        PRESERVE_HTTP1_HEADER_CASE_FIELD_NUMBER: _ClassVar[int]
        X_FORWARDED_HOST_FIELD_NUMBER: _ClassVar[int]
        X_FORWARDED_PORT_FIELD_NUMBER: _ClassVar[int]
        forwarded_client_cert: ForwardClientCertDetails
        set_current_client_cert_details: ProxyConfig.ProxyHeaders.SetCurrentClientCertDetails
        request_id: ProxyConfig.ProxyHeaders.RequestId
        server: ProxyConfig.ProxyHeaders.Server
        attempt_count: ProxyConfig.ProxyHeaders.AttemptCount
        envoy_debug_headers: ProxyConfig.ProxyHeaders.EnvoyDebugHeaders
        metadata_exchange_headers: ProxyConfig.ProxyHeaders.MetadataExchangeHeaders
        preserve_http1_header_case: _wrappers_pb2.BoolValue
        x_forwarded_host: ProxyConfig.ProxyHeaders.XForwardedHost
        x_forwarded_port: ProxyConfig.ProxyHeaders.XForwardedPort
        def __init__(self, forwarded_client_cert: _Optional[_Union[ForwardClientCertDetails, str]] = ..., set_current_client_cert_details: _Optional[_Union[ProxyConfig.ProxyHeaders.SetCurrentClientCertDetails, _Mapping]] = ..., request_id: _Optional[_Union[ProxyConfig.ProxyHeaders.RequestId, _Mapping]] = ..., server: _Optional[_Union[ProxyConfig.ProxyHeaders.Server, _Mapping]] = ..., attempt_count: _Optional[_Union[ProxyConfig.ProxyHeaders.AttemptCount, _Mapping]] = ..., envoy_debug_headers: _Optional[_Union[ProxyConfig.ProxyHeaders.EnvoyDebugHeaders, _Mapping]] = ..., metadata_exchange_headers: _Optional[_Union[ProxyConfig.ProxyHeaders.MetadataExchangeHeaders, _Mapping]] = ..., preserve_http1_header_case: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ..., x_forwarded_host: _Optional[_Union[ProxyConfig.ProxyHeaders.XForwardedHost, _Mapping]] = ..., x_forwarded_port: _Optional[_Union[ProxyConfig.ProxyHeaders.XForwardedPort, _Mapping]] = ...) -> None: ...
    class ConnectionSettings(_message.Message):
        __slots__ = ("profile", "listener_per_connection_buffer_limit_bytes", "cluster_per_connection_buffer_limit_bytes", "http_idle_timeout", "http_max_connection_duration", "http_drain_timeout", "http_request_timeout", "http_request_headers_timeout", "http_stream_idle_timeout", "http_max_stream_duration", "http_max_concurrent_streams", "http2_initial_stream_window_size", "http2_initial_connection_window_size", "http_headers_with_underscores_action", "http_merge_slashes", "http_path_with_escaped_slashes_action", "listener_connection_limit", "global_downstream_connection_limit")
        class Profile(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
            __slots__ = ()
            SIDECAR: _ClassVar[ProxyConfig.ConnectionSettings.Profile]
            EDGE: _ClassVar[ProxyConfig.ConnectionSettings.Profile]
        SIDECAR: ProxyConfig.ConnectionSettings.Profile
        EDGE: ProxyConfig.ConnectionSettings.Profile
        class HeadersWithUnderscoresAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
            __slots__ = ()
            HEADERS_WITH_UNDERSCORES_UNSPECIFIED: _ClassVar[ProxyConfig.ConnectionSettings.HeadersWithUnderscoresAction]
            HEADERS_WITH_UNDERSCORES_ALLOW: _ClassVar[ProxyConfig.ConnectionSettings.HeadersWithUnderscoresAction]
            HEADERS_WITH_UNDERSCORES_REJECT_REQUEST: _ClassVar[ProxyConfig.ConnectionSettings.HeadersWithUnderscoresAction]
            HEADERS_WITH_UNDERSCORES_DROP_HEADER: _ClassVar[ProxyConfig.ConnectionSettings.HeadersWithUnderscoresAction]
        HEADERS_WITH_UNDERSCORES_UNSPECIFIED: ProxyConfig.ConnectionSettings.HeadersWithUnderscoresAction
        HEADERS_WITH_UNDERSCORES_ALLOW: ProxyConfig.ConnectionSettings.HeadersWithUnderscoresAction
        HEADERS_WITH_UNDERSCORES_REJECT_REQUEST: ProxyConfig.ConnectionSettings.HeadersWithUnderscoresAction
        HEADERS_WITH_UNDERSCORES_DROP_HEADER: ProxyConfig.ConnectionSettings.HeadersWithUnderscoresAction
        class PathWithEscapedSlashesAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
            __slots__ = ()
            PATH_WITH_ESCAPED_SLASHES_UNSPECIFIED: _ClassVar[ProxyConfig.ConnectionSettings.PathWithEscapedSlashesAction]
            KEEP_UNCHANGED: _ClassVar[ProxyConfig.ConnectionSettings.PathWithEscapedSlashesAction]
            REJECT_REQUEST: _ClassVar[ProxyConfig.ConnectionSettings.PathWithEscapedSlashesAction]
            UNESCAPE_AND_REDIRECT: _ClassVar[ProxyConfig.ConnectionSettings.PathWithEscapedSlashesAction]
            UNESCAPE_AND_FORWARD: _ClassVar[ProxyConfig.ConnectionSettings.PathWithEscapedSlashesAction]
        PATH_WITH_ESCAPED_SLASHES_UNSPECIFIED: ProxyConfig.ConnectionSettings.PathWithEscapedSlashesAction
        KEEP_UNCHANGED: ProxyConfig.ConnectionSettings.PathWithEscapedSlashesAction
        REJECT_REQUEST: ProxyConfig.ConnectionSettings.PathWithEscapedSlashesAction
        UNESCAPE_AND_REDIRECT: ProxyConfig.ConnectionSettings.PathWithEscapedSlashesAction
        UNESCAPE_AND_FORWARD: ProxyConfig.ConnectionSettings.PathWithEscapedSlashesAction
        PROFILE_FIELD_NUMBER: _ClassVar[int]
        LISTENER_PER_CONNECTION_BUFFER_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
        CLUSTER_PER_CONNECTION_BUFFER_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
        HTTP_IDLE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
        HTTP_MAX_CONNECTION_DURATION_FIELD_NUMBER: _ClassVar[int]
        HTTP_DRAIN_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
        HTTP_REQUEST_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
        HTTP_REQUEST_HEADERS_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
        HTTP_STREAM_IDLE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
        HTTP_MAX_STREAM_DURATION_FIELD_NUMBER: _ClassVar[int]
        HTTP_MAX_CONCURRENT_STREAMS_FIELD_NUMBER: _ClassVar[int]
        HTTP2_INITIAL_STREAM_WINDOW_SIZE_FIELD_NUMBER: _ClassVar[int]
        HTTP2_INITIAL_CONNECTION_WINDOW_SIZE_FIELD_NUMBER: _ClassVar[int]
        HTTP_HEADERS_WITH_UNDERSCORES_ACTION_FIELD_NUMBER: _ClassVar[int]
        HTTP_MERGE_SLASHES_FIELD_NUMBER: _ClassVar[int]
        HTTP_PATH_WITH_ESCAPED_SLASHES_ACTION_FIELD_NUMBER: _ClassVar[int]
        LISTENER_CONNECTION_LIMIT_FIELD_NUMBER: _ClassVar[int]
        GLOBAL_DOWNSTREAM_CONNECTION_LIMIT_FIELD_NUMBER: _ClassVar[int]
        profile: ProxyConfig.ConnectionSettings.Profile
        listener_per_connection_buffer_limit_bytes: _wrappers_pb2.Int32Value
        cluster_per_connection_buffer_limit_bytes: _wrappers_pb2.Int32Value
        http_idle_timeout: _duration_pb2.Duration
        http_max_connection_duration: _duration_pb2.Duration
        http_drain_timeout: _duration_pb2.Duration
        http_request_timeout: _duration_pb2.Duration
        http_request_headers_timeout: _duration_pb2.Duration
        http_stream_idle_timeout: _duration_pb2.Duration
        http_max_stream_duration: _duration_pb2.Duration
        http_max_concurrent_streams: _wrappers_pb2.Int32Value
        http2_initial_stream_window_size: _wrappers_pb2.Int32Value
        http2_initial_connection_window_size: _wrappers_pb2.Int32Value
        http_headers_with_underscores_action: ProxyConfig.ConnectionSettings.HeadersWithUnderscoresAction
        http_merge_slashes: _wrappers_pb2.BoolValue
        http_path_with_escaped_slashes_action: ProxyConfig.ConnectionSettings.PathWithEscapedSlashesAction
        listener_connection_limit: _wrappers_pb2.Int32Value
        global_downstream_connection_limit: _wrappers_pb2.Int32Value
        def __init__(self, profile: _Optional[_Union[ProxyConfig.ConnectionSettings.Profile, str]] = ..., listener_per_connection_buffer_limit_bytes: _Optional[_Union[_wrappers_pb2.Int32Value, _Mapping]] = ..., cluster_per_connection_buffer_limit_bytes: _Optional[_Union[_wrappers_pb2.Int32Value, _Mapping]] = ..., http_idle_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., http_max_connection_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., http_drain_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., http_request_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., http_request_headers_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., http_stream_idle_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., http_max_stream_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., http_max_concurrent_streams: _Optional[_Union[_wrappers_pb2.Int32Value, _Mapping]] = ..., http2_initial_stream_window_size: _Optional[_Union[_wrappers_pb2.Int32Value, _Mapping]] = ..., http2_initial_connection_window_size: _Optional[_Union[_wrappers_pb2.Int32Value, _Mapping]] = ..., http_headers_with_underscores_action: _Optional[_Union[ProxyConfig.ConnectionSettings.HeadersWithUnderscoresAction, str]] = ..., http_merge_slashes: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ..., http_path_with_escaped_slashes_action: _Optional[_Union[ProxyConfig.ConnectionSettings.PathWithEscapedSlashesAction, str]] = ..., listener_connection_limit: _Optional[_Union[_wrappers_pb2.Int32Value, _Mapping]] = ..., global_downstream_connection_limit: _Optional[_Union[_wrappers_pb2.Int32Value, _Mapping]] = ...) -> None: ...
    CONFIG_PATH_FIELD_NUMBER: _ClassVar[int]
    BINARY_PATH_FIELD_NUMBER: _ClassVar[int]
    SERVICE_CLUSTER_FIELD_NUMBER: _ClassVar[int]
    TRACING_SERVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    DRAIN_DURATION_FIELD_NUMBER: _ClassVar[int]
    DISCOVERY_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DISCOVERY_REFRESH_DELAY_FIELD_NUMBER: _ClassVar[int]
    ZIPKIN_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATSD_UDP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ENVOY_METRICS_SERVICE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PROXY_ADMIN_PORT_FIELD_NUMBER: _ClassVar[int]
    AVAILABILITY_ZONE_FIELD_NUMBER: _ClassVar[int]
    CONTROL_PLANE_AUTH_POLICY_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_CONFIG_FILE_FIELD_NUMBER: _ClassVar[int]
    STAT_NAME_LENGTH_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    PROXY_BOOTSTRAP_TEMPLATE_PATH_FIELD_NUMBER: _ClassVar[int]
    INTERCEPTION_MODE_FIELD_NUMBER: _ClassVar[int]
    TRACING_FIELD_NUMBER: _ClassVar[int]
    SDS_FIELD_NUMBER: _ClassVar[int]
    ENVOY_ACCESS_LOG_SERVICE_FIELD_NUMBER: _ClassVar[int]
    ENVOY_METRICS_SERVICE_FIELD_NUMBER: _ClassVar[int]
    PROXY_METADATA_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_VALUES_FIELD_NUMBER: _ClassVar[int]
    STATUS_PORT_FIELD_NUMBER: _ClassVar[int]
    EXTRA_STAT_TAGS_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    TERMINATION_DRAIN_DURATION_FIELD_NUMBER: _ClassVar[int]
    MESH_ID_FIELD_NUMBER: _ClassVar[int]
    READINESS_PROBE_FIELD_NUMBER: _ClassVar[int]
    PROXY_STATS_MATCHER_FIELD_NUMBER: _ClassVar[int]
    HOLD_APPLICATION_UNTIL_PROXY_STARTS_FIELD_NUMBER: _ClassVar[int]
    CA_CERTIFICATES_PEM_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_KEY_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    PROXY_HEADERS_FIELD_NUMBER: _ClassVar[int]
    FILE_FLUSH_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    FILE_FLUSH_MIN_SIZE_KB_FIELD_NUMBER: _ClassVar[int]
    STATS_COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    CONNECTION_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    config_path: str
    binary_path: str
    service_cluster: str
    tracing_service_name: ProxyConfig.TracingServiceName
    drain_duration: _duration_pb2.Duration
    discovery_address: str
    discovery_refresh_delay: _duration_pb2.Duration
    zipkin_address: str
    statsd_udp_address: str
    envoy_metrics_service_address: str
    proxy_admin_port: int
    availability_zone: str
    control_plane_auth_policy: AuthenticationPolicy
    custom_config_file: str
    stat_name_length: int
    concurrency: _wrappers_pb2.Int32Value
    proxy_bootstrap_template_path: str
    interception_mode: ProxyConfig.InboundInterceptionMode
    tracing: Tracing
    sds: SDS
    envoy_access_log_service: RemoteService
    envoy_metrics_service: RemoteService
    proxy_metadata: _containers.ScalarMap[str, str]
    runtime_values: _containers.ScalarMap[str, str]
    status_port: int
    extra_stat_tags: _containers.RepeatedScalarFieldContainer[str]
    gateway_topology: Topology
    termination_drain_duration: _duration_pb2.Duration
    mesh_id: str
    readiness_probe: _networking_pb2.ReadinessProbe
    proxy_stats_matcher: ProxyConfig.ProxyStatsMatcher
    hold_application_until_proxy_starts: _wrappers_pb2.BoolValue
    ca_certificates_pem: _containers.RepeatedScalarFieldContainer[str]
    image: _networking_v1beta1_pb2.ProxyImage
    private_key_provider: PrivateKeyProvider
    proxy_headers: ProxyConfig.ProxyHeaders
    file_flush_interval: _duration_pb2.Duration
    file_flush_min_size_kb: int
    stats_compression: _wrappers_pb2.BoolValue
    connection_settings: ProxyConfig.ConnectionSettings
    def __init__(self, config_path: _Optional[str] = ..., binary_path: _Optional[str] = ..., service_cluster: _Optional[str] = ..., tracing_service_name: _Optional[_Union[ProxyConfig.TracingServiceName, str]] = ..., drain_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., discovery_address: _Optional[str] = ..., discovery_refresh_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., zipkin_address: _Optional[str] = ..., statsd_udp_address: _Optional[str] = ..., envoy_metrics_service_address: _Optional[str] = ..., proxy_admin_port: _Optional[int] = ..., availability_zone: _Optional[str] = ..., control_plane_auth_policy: _Optional[_Union[AuthenticationPolicy, str]] = ..., custom_config_file: _Optional[str] = ..., stat_name_length: _Optional[int] = ..., concurrency: _Optional[_Union[_wrappers_pb2.Int32Value, _Mapping]] = ..., proxy_bootstrap_template_path: _Optional[str] = ..., interception_mode: _Optional[_Union[ProxyConfig.InboundInterceptionMode, str]] = ..., tracing: _Optional[_Union[Tracing, _Mapping]] = ..., sds: _Optional[_Union[SDS, _Mapping]] = ..., envoy_access_log_service: _Optional[_Union[RemoteService, _Mapping]] = ..., envoy_metrics_service: _Optional[_Union[RemoteService, _Mapping]] = ..., proxy_metadata: _Optional[_Mapping[str, str]] = ..., runtime_values: _Optional[_Mapping[str, str]] = ..., status_port: _Optional[int] = ..., extra_stat_tags: _Optional[_Iterable[str]] = ..., gateway_topology: _Optional[_Union[Topology, _Mapping]] = ..., termination_drain_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., mesh_id: _Optional[str] = ..., readiness_probe: _Optional[_Union[_networking_pb2.ReadinessProbe, _Mapping]] = ..., proxy_stats_matcher: _Optional[_Union[ProxyConfig.ProxyStatsMatcher, _Mapping]] = ..., hold_application_until_proxy_starts: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ..., ca_certificates_pem: _Optional[_Iterable[str]] = ..., image: _Optional[_Union[_networking_v1beta1_pb2.ProxyImage, _Mapping]] = ..., private_key_provider: _Optional[_Union[PrivateKeyProvider, _Mapping]] = ..., proxy_headers: _Optional[_Union[ProxyConfig.ProxyHeaders, _Mapping]] = ..., file_flush_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., file_flush_min_size_kb: _Optional[int] = ..., stats_compression: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ..., connection_settings: _Optional[_Union[ProxyConfig.ConnectionSettings, _Mapping]] = ...) -> None: ...

class RemoteService(_message.Message):
    __slots__ = ("address", "tls_settings", "tcp_keepalive")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TLS_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    TCP_KEEPALIVE_FIELD_NUMBER: _ClassVar[int]
    address: str
    tls_settings: _networking_pb2.ClientTLSSettings
    tcp_keepalive: _networking_pb2.ConnectionPoolSettings.TCPSettings.TcpKeepalive
    def __init__(self, address: _Optional[str] = ..., tls_settings: _Optional[_Union[_networking_pb2.ClientTLSSettings, _Mapping]] = ..., tcp_keepalive: _Optional[_Union[_networking_pb2.ConnectionPoolSettings.TCPSettings.TcpKeepalive, _Mapping]] = ...) -> None: ...
