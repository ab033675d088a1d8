"""Message classes that declare only the fields a component reads or writes of a wire type ("heads").

The agent speaks a few Envoy API messages (the XDS proxy's routing fields, the
SDS server's requests and secrets) but needs a handful of their fields. Envoy's
generated modules pull in the whole Envoy API graph they depend on (importing
`envoy.service.discovery.v3.discovery_pb2` alone costs ~3 MB of memory, most
of it anonymous, in every agent); a head declares the same field numbers and
types, so its bytes are the same on the wire, and every field it does not
declare is kept as unknown bytes or never written. Each module's heads live in
a private descriptor pool, so they never clash with the real types when a
process (a test, istiod-local) loads those too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from google.protobuf import descriptor_pool, message_factory

# FieldDescriptorProto's Type and Label values (descriptor.proto). The file descriptor is written here with
# the protobuf wire format directly: `descriptor_pb2` itself costs every agent ~0.6 MB of anonymous memory.
STRING = 9
MESSAGE = 11
BYTES = 12
INT32 = 5
OPTIONAL = 1
REPEATED = 3


class Field(NamedTuple):
    """One declared field: upstream's name, number and type; `message` names another head of the same set;
    `oneof` puts it in a oneof of that name (for a field that is a oneof member upstream, so that an empty
    value is still written, as upstream writes it)."""

    name: str
    number: int
    kind: int
    label: int = OPTIONAL
    message: str = ""
    oneof: str = ""


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _len(number: int, payload: bytes) -> bytes:
    """A length-delimited field (strings and messages)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _message(package: str, name: str, fields: Sequence[Field | tuple[Any, ...]]) -> bytes:
    """A DescriptorProto: name (1), field (2), oneof_decl (8)."""
    out = _len(1, name.encode())
    oneofs: list[str] = []
    for spec in fields:
        f = Field(*spec)
        # FieldDescriptorProto: name (1), number (3), label (4), type (5), type_name (6), oneof_index (9).
        field = _len(1, f.name.encode()) + _int(3, f.number) + _int(4, f.label) + _int(5, f.kind)
        if f.message:
            field += _len(6, f".{package}.{f.message}".encode())
        if f.oneof:
            if f.oneof not in oneofs:
                oneofs.append(f.oneof)
            field += _int(9, oneofs.index(f.oneof))
        out += _len(2, field)
    for oneof in oneofs:
        out += _len(8, _len(1, oneof.encode()))  # OneofDescriptorProto: name (1)
    return out


def file_descriptor(package: str, heads: Mapping[str, Sequence[Field | tuple[Any, ...]]]) -> bytes:
    """The serialized FileDescriptorProto (name 1, package 2, message_type 4, syntax 12) of `heads`."""
    out = _len(1, f"{package.replace('.', '/')}.proto".encode()) + _len(2, package.encode())
    for name, fields in heads.items():
        out += _len(4, _message(package, name, fields))
    return out + _len(12, b"proto3")


def build(package: str, heads: Mapping[str, Sequence[Field | tuple[Any, ...]]]) -> dict[str, Any]:
    """Message classes named as `heads`' keys, in a fresh pool under `package` (proto3)."""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(file_descriptor(package, heads))
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}")) for name in heads}
