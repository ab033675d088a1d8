"""Reading protobuf messages from their JSON (YAML) form, as upstream's parser does, without protobuf.

Upstream reads mesh config, `PROXY_CONFIG` and the `proxy.istio.io/config`
annotation with golang/protobuf's legacy `jsonpb` (after converting YAML to
JSON): field names in either spelling (`discoveryAddress`, `discovery_address`),
unknown fields dropped, `null` meaning "not set", and every value checked
against its field's type. A value of the wrong type fails the whole document,
so a pod with `statusPort: "abc"` or `proxyMetadata: {A: true}` does not start.

This module holds a small description of message types (`Message`, `Field`)
and `read_message()`, which validates one value against one type and returns
it in canonical protojson shape (what upstream's marshaller would write back):
lowerCamel names, durations as `"2s"` / `"0.500s"`, 64-bit integers as strings,
wrappers unwrapped, enums by name and, inside messages, fields holding their
zero value left out. It is pure and imports nothing heavy, because options are
resolved before anything starts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from istio_agent.config.durations import parse_duration
from istio_agent.config.errors import ConfigError

log = logging.getLogger(__name__)

INT32 = (-(2**31), 2**31 - 1)
UINT32 = (0, 2**32 - 1)
INT64 = (-(2**63), 2**63 - 1)
UINT64 = (0, 2**64 - 1)
_RANGES = {"int32": INT32, "uint32": UINT32, "int64": INT64, "uint64": UINT64}
SCALAR_KINDS = ("string", "bool", "int32", "uint32", "int64", "uint64", "double", "float", "bytes")


@dataclass(frozen=True)
class Enum:
    """An enum type: its values by name and number (numbers outside it are kept as numbers, as proto3 does)."""

    full_name: str
    values: tuple[tuple[str, int], ...]

    def name_of(self, number: int) -> str | int:
        return next((name for name, value in self.values if value == number), number)

    def zero(self) -> str | int:
        return self.name_of(0)


@dataclass(frozen=True)
class Field:
    """One field: proto name, kind, and how it repeats.

    `kind` is a scalar kind, `"enum"`, `"message"`, `"duration"`, or `"wrapper"` (a
    google.protobuf wrapper whose value has kind `wraps`). `map_of` set means a
    `map<string, ...>` whose values are described by `map_of`.
    """

    name: str
    kind: str
    repeated: bool = False
    enum: Enum | None = None
    message: Message | None = None
    wraps: str = ""
    oneof: str = ""
    map_of: Field | None = None

    @property
    def json_name(self) -> str:
        head, *rest = self.name.split("_")
        return head + "".join(part[:1].upper() + part[1:] for part in rest)

    @property
    def has_presence(self) -> bool:
        """Set-ness is kept for messages, wrappers, durations and oneof members; other fields are set when non-zero."""
        if self.repeated or self.map_of is not None:
            return False
        return self.kind in ("message", "wrapper", "duration") or bool(self.oneof)


@dataclass(frozen=True)
class Message:
    full_name: str
    fields: tuple[Field, ...] = field(default_factory=tuple)

    def lookup(self, name: str) -> Field | None:
        for candidate in self.fields:
            if name in (candidate.json_name, candidate.name):
                return candidate
        return None


def scalar(name: str, kind: str, **kw: Any) -> Field:
    return Field(name, kind, **kw)


def repeated(name: str, kind: str, **kw: Any) -> Field:
    return Field(name, kind, repeated=True, **kw)


def message(name: str, msg: Message, **kw: Any) -> Field:
    return Field(name, "message", message=msg, **kw)


def enum(name: str, enum_type: Enum, **kw: Any) -> Field:
    return Field(name, "enum", enum=enum_type, **kw)


def wrapper(name: str, kind: str, **kw: Any) -> Field:
    return Field(name, "wrapper", wraps=kind, **kw)


def duration(name: str, **kw: Any) -> Field:
    return Field(name, "duration", **kw)


def string_map(name: str) -> Field:
    return Field(name, "map", map_of=Field("value", "string"))


def message_map(name: str, msg: Message) -> Field:
    return Field(name, "map", map_of=Field("value", "message", message=msg))


# ------------------------------------------------------------------------------------------- values
def _fail(path: str, expected: str, value: Any) -> ConfigError:
    return ConfigError(f"field {path}: expected {expected}, got {value!r}")


def _integer(kind: str, path: str, value: Any) -> int:
    """jsonpb's integers: a JSON number without fraction or exponent, or the same digits quoted."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _fail(path, f"an integer ({kind})", value)
    text = value.strip() if isinstance(value, str) else str(value)
    body = text[1:] if text[:1] == "-" else text
    if not body.isdigit() or (len(body) > 1 and body[0] == "0" and isinstance(value, str)):
        raise _fail(path, f"an integer ({kind})", value)
    number = int(text)
    low, high = _RANGES[kind]
    if not low <= number <= high:
        raise ConfigError(f"field {path}: {number} is out of range for {kind}")
    return number


def _floating(path: str, value: Any) -> float:
    if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
        return float(value.replace("Infinity", "inf"))
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise _fail(path, "a number", value)
    try:
        return float(value)
    except ValueError:
        raise _fail(path, "a number", value) from None


def format_duration_json(seconds: float) -> str:
    """A Duration as protojson writes it: whole seconds, or 3, 6 or 9 fractional digits (`"0.500s"`)."""
    nanos = round(seconds * 1e9)
    sign = "-" if nanos < 0 else ""
    whole, frac = divmod(abs(nanos), 10**9)
    if frac == 0:
        return f"{sign}{whole}s"
    digits = f"{frac:09d}"
    while digits.endswith("000"):
        digits = digits[:-3]
    return f"{sign}{whole}.{digits}s"


def _duration(path: str, value: Any) -> str:
    """Durations are strings Go's time.ParseDuration reads (`"45s"`, `"1m30s"`, `"500ms"`); never negative here."""
    if not isinstance(value, str):
        raise _fail(path, 'a duration string such as "45s"', value)
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        if "longer than" in str(exc):
            raise ConfigError(f"field {path}: duration {value!r} is out of range (longer than Go's "
                              "2562047h47m16.854775807s)") from None
        raise _fail(path, 'a duration such as "45s"', value) from None
    if seconds < 0:
        raise ConfigError(f"field {path}: duration {value!r} is negative")
    return format_duration_json(seconds)


def _enum_value(enum_type: Enum, path: str, value: Any) -> str | int:
    if isinstance(value, str):
        if any(name == value for name, _ in enum_type.values):
            return value
        allowed = ", ".join(name for name, _ in enum_type.values)
        raise ConfigError(f"field {path}: {value!r} is not one of {allowed}")
    if isinstance(value, int) and not isinstance(value, bool):
        return enum_type.name_of(_integer("int32", path, value))
    raise _fail(path, f"a {enum_type.full_name} name", value)


def _scalar(kind: str, path: str, value: Any) -> Any:
    if kind == "string":
        if not isinstance(value, str):
            hint = ' (quote it: "true")' if isinstance(value, bool) else ""
            raise _fail(path, f"a string{hint}", value)
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise _fail(path, "true or false", value)
        return value
    if kind in ("int32", "uint32"):
        return _integer(kind, path, value)
    if kind in ("int64", "uint64"):
        return str(_integer(kind, path, value))  # protojson writes 64-bit integers as strings
    if kind in ("double", "float"):
        return _floating(path, value)
    if kind == "bytes":
        if not isinstance(value, str):
            raise _fail(path, "base64 text", value)
        return value
    raise AssertionError(f"unknown kind {kind}")


def read_value(spec: Field, path: str, value: Any) -> Any:
    """One field's value (never None), validated and in canonical protojson shape."""
    if spec.map_of is not None:
        if not isinstance(value, Mapping):
            raise _fail(path, "a map", value)
        return {str(k): _zero_if_none(spec.map_of, f"{path}.{k}", v) for k, v in value.items()}
    if spec.repeated:
        if not isinstance(value, list):
            raise _fail(path, "a list", value)
        item = Field(spec.name, spec.kind, enum=spec.enum, message=spec.message, wraps=spec.wraps)
        return [_zero_if_none(item, f"{path}[{i}]", v) for i, v in enumerate(value)]
    if spec.kind == "message":
        assert spec.message is not None
        return read_message(spec.message, value, path)
    if spec.kind == "duration":
        return _duration(path, value)
    if spec.kind == "enum":
        assert spec.enum is not None
        return _enum_value(spec.enum, path, value)
    if spec.kind == "wrapper":
        return _scalar(spec.wraps, path, value)
    return _scalar(spec.kind, path, value)


def _zero_if_none(spec: Field, path: str, value: Any) -> Any:
    """A null list item or map value reads as its type's zero value, as jsonpb leaves it."""
    if value is None:
        return zero_value(spec)
    return read_value(spec, path, value)


def zero_value(spec: Field) -> Any:
    if spec.kind == "message":
        return {}
    if spec.kind == "enum":
        assert spec.enum is not None
        return spec.enum.zero()
    kind = spec.wraps if spec.kind == "wrapper" else spec.kind
    return {"string": "", "bytes": "", "bool": False, "int64": "0", "uint64": "0", "duration": "0s",
            "double": 0.0, "float": 0.0}.get(kind, 0)


def is_zero(spec: Field, value: Any) -> bool:
    """True when protojson would leave this field out (no presence and holding its zero value)."""
    if spec.has_presence:
        return False
    if spec.repeated or spec.map_of is not None:
        return not value
    return bool(value == zero_value(spec))


Warn = Callable[[str], None]


def read_fields(msg: Message, value: Any, path: str, warn: Warn | None = None) -> dict[str, Any]:
    """The fields `value` sets, by JSON name, validated; zero values kept (they override a lower layer).

    Names may use either spelling; unknown names are reported through `warn` and
    dropped; `null` means not set. Of several members of one oneof, the last in
    declaration order wins, as upstream's parser sets them in that order.
    """
    if not isinstance(value, Mapping):
        raise _fail(path or msg.full_name, "an object", value)
    report = warn or (lambda text: log.warning("%s", text))
    out: dict[str, Any] = {}
    chosen: dict[str, str] = {}
    for raw_name, item in value.items():
        name = str(raw_name)
        spec = msg.lookup(name)
        where = f"{path}.{name}" if path else name
        if spec is None:
            report(f"ignoring unknown field {where!r} of {msg.full_name}")
            continue
        if item is None:
            continue
        out[spec.json_name] = read_value(spec, f"{path}.{spec.json_name}" if path else spec.json_name, item)
    for spec in msg.fields:  # declaration order decides between oneof members
        if spec.oneof and spec.json_name in out:
            previous = chosen.get(spec.oneof)
            if previous is not None:
                report(f"{path or msg.full_name}: {previous!r} and {spec.json_name!r} are both set; "
                       f"{spec.json_name!r} wins")
                del out[previous]
            chosen[spec.oneof] = spec.json_name
    return {spec.json_name: out[spec.json_name] for spec in msg.fields if spec.json_name in out}


def read_message(msg: Message, value: Any, path: str, warn: Warn | None = None) -> dict[str, Any]:
    """A nested message in canonical protojson shape: as `read_fields`, with zero-valued fields left out."""
    fields = read_fields(msg, value, path, warn)
    return {name: item for name, item in fields.items() if not is_zero(_by_json(msg, name), item)}


def _by_json(msg: Message, name: str) -> Field:
    spec = msg.lookup(name)
    assert spec is not None
    return spec
