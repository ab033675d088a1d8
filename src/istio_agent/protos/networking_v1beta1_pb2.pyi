from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ProxyImage(_message.Message):
    __slots__ = ("image_type",)
    IMAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    image_type: str
    def __init__(self, image_type: _Optional[str] = ...) -> None: ...
