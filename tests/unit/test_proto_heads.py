"""The heads' hand-written FileDescriptorProto is the one protobuf's own descriptor classes would build."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import descriptor_pb2

from istio_agent.protos import heads
from istio_agent.xds.core import messages


def reference(package: str, spec: Mapping[str, Sequence[Any]]) -> descriptor_pb2.FileDescriptorProto:
    """The same file built with descriptor_pb2 (the reference encoder)."""
    file = descriptor_pb2.FileDescriptorProto(name=f"{package.replace('.', '/')}.proto", package=package,
                                              syntax="proto3")
    for name, fields in spec.items():
        message = file.message_type.add(name=name)
        oneofs: list[str] = []
        for item in fields:
            f = heads.Field(*item)
            field = message.field.add(name=f.name, number=f.number, type=f.kind, label=f.label)  # type: ignore[arg-type]
            if f.message:
                field.type_name = f".{package}.{f.message}"
            if f.oneof:
                if f.oneof not in oneofs:
                    oneofs.append(f.oneof)
                    message.oneof_decl.add(name=f.oneof)
                field.oneof_index = oneofs.index(f.oneof)
    return file


SAMPLE = {
    "Inner": [heads.Field("value", 1, heads.BYTES), heads.Field("count", 300, heads.INT32)],
    "Outer": [
        heads.Field("names", 3, heads.STRING, heads.REPEATED),
        heads.Field("inner", 2, heads.MESSAGE, message="Inner"),
        heads.Field("a", 20, heads.STRING, oneof="choice"),
        heads.Field("b", 21, heads.MESSAGE, message="Inner", oneof="choice"),
        heads.Field("c", 22, heads.INT32, oneof="other"),
    ],
}


def test_the_constants_are_descriptor_protos_values() -> None:
    proto = descriptor_pb2.FieldDescriptorProto
    assert (heads.STRING, heads.BYTES, heads.INT32, heads.MESSAGE) == (
        proto.TYPE_STRING, proto.TYPE_BYTES, proto.TYPE_INT32, proto.TYPE_MESSAGE)
    assert (heads.OPTIONAL, heads.REPEATED) == (proto.LABEL_OPTIONAL, proto.LABEL_REPEATED)


def test_the_serialized_file_is_the_reference_file() -> None:
    for package, spec in (("test.heads", SAMPLE), ("istio_agent.xds.heads_check", messages._HEADS)):
        parsed = descriptor_pb2.FileDescriptorProto.FromString(heads.file_descriptor(package, spec))
        assert parsed == reference(package, spec)


def test_built_classes_round_trip_their_fields() -> None:
    classes = heads.build("test.heads_round_trip", SAMPLE)
    outer = classes["Outer"](names=["x", "y"], a="")
    outer.inner.count = 7
    data = outer.SerializeToString()
    back = classes["Outer"].FromString(data)
    assert list(back.names) == ["x", "y"] and back.inner.count == 7
    assert back.WhichOneof("choice") == "a"  # an empty oneof member is still written
