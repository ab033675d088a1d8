import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import wrappers_pb2 as _wrappers_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ClientTLSSettings(_message.Message):
    __slots__ = ("mode", "client_certificate", "private_key", "ca_certificates", "credential_name", "subject_alt_names", "sni", "insecure_skip_verify", "ca_crl")
    class TLSmode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        DISABLE: _ClassVar[ClientTLSSettings.TLSmode]
        SIMPLE: _ClassVar[ClientTLSSettings.TLSmode]
        MUTUAL: _ClassVar[ClientTLSSettings.TLSmode]
        ISTIO_MUTUAL: _ClassVar[ClientTLSSettings.TLSmode]
    DISABLE: ClientTLSSettings.TLSmode
    SIMPLE: ClientTLSSettings.TLSmode
    MUTUAL: ClientTLSSettings.TLSmode
    ISTIO_MUTUAL: ClientTLSSettings.TLSmode
    MODE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_KEY_FIELD_NUMBER: _ClassVar[int]
    CA_CERTIFICATES_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_NAME_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ALT_NAMES_FIELD_NUMBER: _ClassVar[int]
    SNI_FIELD_NUMBER: _ClassVar[int]
    INSECURE_SKIP_VERIFY_FIELD_NUMBER: _ClassVar[int]
    CA_CRL_FIELD_NUMBER: _ClassVar[int]
    mode: ClientTLSSettings.TLSmode
    client_certificate: str
    private_key: str
    ca_certificates: str
    credential_name: str
    subject_alt_names: _containers.RepeatedScalarFieldContainer[str]
    sni: str
    insecure_skip_verify: _wrappers_pb2.BoolValue
    ca_crl: str
    def __init__(self, mode: _Optional[_Union[ClientTLSSettings.TLSmode, str]] = ..., client_certificate: _Optional[str] = ..., private_key: _Optional[str] = ..., ca_certificates: _Optional[str] = ..., credential_name: _Optional[str] = ..., subject_alt_names: _Optional[_Iterable[str]] = ..., sni: _Optional[str] = ..., insecure_skip_verify: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ..., ca_crl: _Optional[str] = ...) -> None: ...

class ConnectionPoolSettings(_message.Message):
    __slots__ = ()
    class TCPSettings(_message.Message):
        __slots__ = ()
        class TcpKeepalive(_message.Message):
            __slots__ = ("probes", "time", "interval")
            PROBES_FIELD_NUMBER: _ClassVar[int]
            TIME_FIELD_NUMBER: _ClassVar[int]
            INTERVAL_FIELD_NUMBER: _ClassVar[int]
            probes: int
            time: _duration_pb2.Duration
            interval: _duration_pb2.Duration
            def __init__(self, probes: _Optional[int] = ..., time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
        def __init__(self) -> None: ...
    def __init__(self) -> None: ...

class ReadinessProbe(_message.Message):
    __slots__ = ("initial_delay_seconds", "timeout_seconds", "period_seconds", "success_threshold", "failure_threshold", "http_get", "tcp_socket", "exec", "grpc")
    INITIAL_DELAY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PERIOD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    FAILURE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    HTTP_GET_FIELD_NUMBER: _ClassVar[int]
    TCP_SOCKET_FIELD_NUMBER: _ClassVar[int]
    EXEC_FIELD_NUMBER: _ClassVar[int]
    GRPC_FIELD_NUMBER: _ClassVar[int]
    initial_delay_seconds: int
    timeout_seconds: int
    period_seconds: int
    success_threshold: int
    failure_threshold: int
    http_get: HTTPHealthCheckConfig
    tcp_socket: TCPHealthCheckConfig
    exec: ExecHealthCheckConfig
    grpc: GrpcHealthCheckConfig
    def __init__(self, initial_delay_seconds: _Optional[int] = ..., timeout_seconds: _Optional[int] = ..., period_seconds: _Optional[int] = ..., success_threshold: _Optional[int] = ..., failure_threshold: _Optional[int] = ..., http_get: _Optional[_Union[HTTPHealthCheckConfig, _Mapping]] = ..., tcp_socket: _Optional[_Union[TCPHealthCheckConfig, _Mapping]] = ..., exec: _Optional[_Union[ExecHealthCheckConfig, _Mapping]] = ..., grpc: _Optional[_Union[GrpcHealthCheckConfig, _Mapping]] = ...) -> None: ...

class HTTPHealthCheckConfig(_message.Message):
    __slots__ = ("path", "port", "host", "scheme", "http_headers")
    PATH_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    HTTP_HEADERS_FIELD_NUMBER: _ClassVar[int]
    path: str
    port: int
    host: str
    scheme: str
    http_headers: _containers.RepeatedCompositeFieldContainer[HTTPHeader]
    def __init__(self, path: _Optional[str] = ..., port: _Optional[int] = ..., host: _Optional[str] = ..., scheme: _Optional[str] = ..., http_headers: _Optional[_Iterable[_Union[HTTPHeader, _Mapping]]] = ...) -> None: ...

class GrpcHealthCheckConfig(_message.Message):
    __slots__ = ("port", "service")
    PORT_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    port: int
    service: str
    def __init__(self, port: _Optional[int] = ..., service: _Optional[str] = ...) -> None: ...

class HTTPHeader(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class TCPHealthCheckConfig(_message.Message):
    __slots__ = ("host", "port")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    host: str
    port: int
    def __init__(self, host: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class ExecHealthCheckConfig(_message.Message):
    __slots__ = ("command",)
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    command: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, command: _Optional[_Iterable[str]] = ...) -> None: ...
