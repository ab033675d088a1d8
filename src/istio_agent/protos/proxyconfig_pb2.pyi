import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import wrappers_pb2 as _wrappers_pb2
from istio_agent.protos import networking_pb2 as _networking_pb2
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
NONE: AuthenticationPolicy
MUTUAL_TLS: AuthenticationPolicy
INHERIT: AuthenticationPolicy

class Tracing(_message.Message):
    __slots__ = ("zipkin", "lightstep", "datadog", "stackdriver", "open_census_agent", "custom_tags", "max_path_tag_length", "sampling", "tls_settings")
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
    zipkin: Tracing.Zipkin
    lightstep: Tracing.Lightstep
    datadog: Tracing.Datadog
    stackdriver: Tracing.Stackdriver
    open_census_agent: Tracing.OpenCensusAgent
    custom_tags: _containers.MessageMap[str, Tracing.CustomTag]
    max_path_tag_length: int
    sampling: float
    tls_settings: _networking_pb2.ClientTLSSettings
    def __init__(self, zipkin: _Optional[_Union[Tracing.Zipkin, _Mapping]] = ..., lightstep: _Optional[_Union[Tracing.Lightstep, _Mapping]] = ..., datadog: _Optional[_Union[Tracing.Datadog, _Mapping]] = ..., stackdriver: _Optional[_Union[Tracing.Stackdriver, _Mapping]] = ..., open_census_agent: _Optional[_Union[Tracing.OpenCensusAgent, _Mapping]] = ..., custom_tags: _Optional[_Mapping[str, Tracing.CustomTag]] = ..., max_path_tag_length: _Optional[int] = ..., sampling: _Optional[float] = ..., tls_settings: _Optional[_Union[_networking_pb2.ClientTLSSettings, _Mapping]] = ...) -> None: ...

class SDS(_message.Message):
    __slots__ = ("enabled", "k8s_sa_jwt_path")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    K8S_SA_JWT_PATH_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    k8s_sa_jwt_path: str
    def __init__(self, enabled: _Optional[bool] = ..., k8s_sa_jwt_path: _Optional[str] = ...) -> None: ...

class Topology(_message.Message):
    __slots__ = ("num_trusted_proxies", "forward_client_cert_details")
    class ForwardClientCertDetails(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNDEFINED: _ClassVar[Topology.ForwardClientCertDetails]
        SANITIZE: _ClassVar[Topology.ForwardClientCertDetails]
        FORWARD_ONLY: _ClassVar[Topology.ForwardClientCertDetails]
        APPEND_FORWARD: _ClassVar[Topology.ForwardClientCertDetails]
        SANITIZE_SET: _ClassVar[Topology.ForwardClientCertDetails]
        ALWAYS_FORWARD_ONLY: _ClassVar[Topology.ForwardClientCertDetails]
    UNDEFINED: Topology.ForwardClientCertDetails
    SANITIZE: Topology.ForwardClientCertDetails
    FORWARD_ONLY: Topology.ForwardClientCertDetails
    APPEND_FORWARD: Topology.ForwardClientCertDetails
    SANITIZE_SET: Topology.ForwardClientCertDetails
    ALWAYS_FORWARD_ONLY: Topology.ForwardClientCertDetails
    NUM_TRUSTED_PROXIES_FIELD_NUMBER: _ClassVar[int]
    FORWARD_CLIENT_CERT_DETAILS_FIELD_NUMBER: _ClassVar[int]
    num_trusted_proxies: int
    forward_client_cert_details: Topology.ForwardClientCertDetails
    def __init__(self, num_trusted_proxies: _Optional[int] = ..., forward_client_cert_details: _Optional[_Union[Topology.ForwardClientCertDetails, str]] = ...) -> None: ...

class PrivateKeyProvider(_message.Message):
    __slots__ = ("cryptomb",)
    class CryptoMb(_message.Message):
        __slots__ = ("poll_delay",)
        POLL_DELAY_FIELD_NUMBER: _ClassVar[int]
        poll_delay: _duration_pb2.Duration
        def __init__(self, poll_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
    CRYPTOMB_FIELD_NUMBER: _ClassVar[int]
    cryptomb: PrivateKeyProvider.CryptoMb
    def __init__(self, cryptomb: _Optional[_Union[PrivateKeyProvider.CryptoMb, _Mapping]] = ...) -> None: ...

class RemoteService(_message.Message):
    __slots__ = ("address", "tls_settings", "tcp_keepalive")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TLS_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    TCP_KEEPALIVE_FIELD_NUMBER: _ClassVar[int]
    address: str
    tls_settings: _networking_pb2.ClientTLSSettings
    tcp_keepalive: _networking_pb2.ConnectionPoolSettings.TCPSettings.TcpKeepalive
    def __init__(self, address: _Optional[str] = ..., tls_settings: _Optional[_Union[_networking_pb2.ClientTLSSettings, _Mapping]] = ..., tcp_keepalive: _Optional[_Union[_networking_pb2.ConnectionPoolSettings.TCPSettings.TcpKeepalive, _Mapping]] = ...) -> None: ...

class ProxyConfig(_message.Message):
    __slots__ = ("config_path", "binary_path", "service_cluster", "tracing_service_name", "drain_duration", "parent_shutdown_duration", "discovery_address", "discovery_refresh_delay", "zipkin_address", "statsd_udp_address", "envoy_metrics_service_address", "proxy_admin_port", "availability_zone", "control_plane_auth_policy", "custom_config_file", "stat_name_length", "concurrency", "proxy_bootstrap_template_path", "interception_mode", "tracing", "sds", "envoy_access_log_service", "envoy_metrics_service", "proxy_metadata", "runtime_values", "status_port", "extra_stat_tags", "gateway_topology", "termination_drain_duration", "mesh_id", "proxy_stats_matcher", "hold_application_until_proxy_starts", "ca_certificates_pem", "private_key_provider")
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
    CONFIG_PATH_FIELD_NUMBER: _ClassVar[int]
    BINARY_PATH_FIELD_NUMBER: _ClassVar[int]
    SERVICE_CLUSTER_FIELD_NUMBER: _ClassVar[int]
    TRACING_SERVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    DRAIN_DURATION_FIELD_NUMBER: _ClassVar[int]
    PARENT_SHUTDOWN_DURATION_FIELD_NUMBER: _ClassVar[int]
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
    PROXY_STATS_MATCHER_FIELD_NUMBER: _ClassVar[int]
    HOLD_APPLICATION_UNTIL_PROXY_STARTS_FIELD_NUMBER: _ClassVar[int]
    CA_CERTIFICATES_PEM_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_KEY_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    config_path: str
    binary_path: str
    service_cluster: str
    tracing_service_name: ProxyConfig.TracingServiceName
    drain_duration: _duration_pb2.Duration
    parent_shutdown_duration: _duration_pb2.Duration
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
    proxy_stats_matcher: ProxyConfig.ProxyStatsMatcher
    hold_application_until_proxy_starts: _wrappers_pb2.BoolValue
    ca_certificates_pem: _containers.RepeatedScalarFieldContainer[str]
    private_key_provider: PrivateKeyProvider
    def __init__(self, config_path: _Optional[str] = ..., binary_path: _Optional[str] = ..., service_cluster: _Optional[str] = ..., tracing_service_name: _Optional[_Union[ProxyConfig.TracingServiceName, str]] = ..., drain_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., parent_shutdown_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., discovery_address: _Optional[str] = ..., discovery_refresh_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., zipkin_address: _Optional[str] = ..., statsd_udp_address: _Optional[str] = ..., envoy_metrics_service_address: _Optional[str] = ..., proxy_admin_port: _Optional[int] = ..., availability_zone: _Optional[str] = ..., control_plane_auth_policy: _Optional[_Union[AuthenticationPolicy, str]] = ..., custom_config_file: _Optional[str] = ..., stat_name_length: _Optional[int] = ..., concurrency: _Optional[_Union[_wrappers_pb2.Int32Value, _Mapping]] = ..., proxy_bootstrap_template_path: _Optional[str] = ..., interception_mode: _Optional[_Union[ProxyConfig.InboundInterceptionMode, str]] = ..., tracing: _Optional[_Union[Tracing, _Mapping]] = ..., sds: _Optional[_Union[SDS, _Mapping]] = ..., envoy_access_log_service: _Optional[_Union[RemoteService, _Mapping]] = ..., envoy_metrics_service: _Optional[_Union[RemoteService, _Mapping]] = ..., proxy_metadata: _Optional[_Mapping[str, str]] = ..., runtime_values: _Optional[_Mapping[str, str]] = ..., status_port: _Optional[int] = ..., extra_stat_tags: _Optional[_Iterable[str]] = ..., gateway_topology: _Optional[_Union[Topology, _Mapping]] = ..., termination_drain_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., mesh_id: _Optional[str] = ..., proxy_stats_matcher: _Optional[_Union[ProxyConfig.ProxyStatsMatcher, _Mapping]] = ..., hold_application_until_proxy_starts: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ..., ca_certificates_pem: _Optional[_Iterable[str]] = ..., private_key_provider: _Optional[_Union[PrivateKeyProvider, _Mapping]] = ...) -> None: ...
