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

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

STRING = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
BYTES = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
INT32 = descriptor_pb2.FieldDescriptorProto.TYPE_INT32
MESSAGE = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
OPTIONAL = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
REPEATED = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED


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


def build(package: str, heads: Mapping[str, Sequence[Field | tuple[Any, ...]]]) -> dict[str, Any]:
    """Message classes named as `heads`' keys, in a fresh pool under `package` (proto3)."""
    file = descriptor_pb2.FileDescriptorProto(name=f"{package.replace('.', '/')}.proto", package=package,
                                              syntax="proto3")
    for name, fields in heads.items():
        message = file.message_type.add(name=name)
        oneofs: dict[str, int] = {}
        for spec in fields:
            f = Field(*spec)
            field = message.field.add(name=f.name, number=f.number, type=f.kind, label=f.label)
            if f.message:
                field.type_name = f".{package}.{f.message}"
            if f.oneof:
                if f.oneof not in oneofs:
                    oneofs[f.oneof] = len(message.oneof_decl)
                    message.oneof_decl.add(name=f.oneof)
                field.oneof_index = oneofs[f.oneof]
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}")) for name in heads}
