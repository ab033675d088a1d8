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
    __slots__ = ("mode", "client_certificate", "private_key", "ca_certificates", "subject_alt_names", "sni", "credential_name", "insecure_skip_verify", "ca_crl")
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
    SUBJECT_ALT_NAMES_FIELD_NUMBER: _ClassVar[int]
    SNI_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_NAME_FIELD_NUMBER: _ClassVar[int]
    INSECURE_SKIP_VERIFY_FIELD_NUMBER: _ClassVar[int]
    CA_CRL_FIELD_NUMBER: _ClassVar[int]
    mode: ClientTLSSettings.TLSmode
    client_certificate: str
    private_key: str
    ca_certificates: str
    subject_alt_names: _containers.RepeatedScalarFieldContainer[str]
    sni: str
    credential_name: str
    insecure_skip_verify: _wrappers_pb2.BoolValue
    ca_crl: str
    def __init__(self, mode: _Optional[_Union[ClientTLSSettings.TLSmode, str]] = ..., client_certificate: _Optional[str] = ..., private_key: _Optional[str] = ..., ca_certificates: _Optional[str] = ..., subject_alt_names: _Optional[_Iterable[str]] = ..., sni: _Optional[str] = ..., credential_name: _Optional[str] = ..., insecure_skip_verify: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ..., ca_crl: _Optional[str] = ...) -> None: ...

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
