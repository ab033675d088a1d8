from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HealthInformation(_message.Message):
    __slots__ = ("status", "error_message")
    class HealthStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        HEALTHY: _ClassVar[HealthInformation.HealthStatus]
        UNHEALTHY: _ClassVar[HealthInformation.HealthStatus]
    HEALTHY: HealthInformation.HealthStatus
    UNHEALTHY: HealthInformation.HealthStatus
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: HealthInformation.HealthStatus
    error_message: str
    def __init__(self, status: _Optional[_Union[HealthInformation.HealthStatus, str]] = ..., error_message: _Optional[str] = ...) -> None: ...
