"""Reading a YAML document field by field, so every error names its line and field.

PyYAML's plain `safe_load` throws away where a value came from. The registry
is hand-written by people, and a refused file must say *where* the mistake is
(`mesh.yaml:14: services[1].ports[0].protocol: ...`), so the parser walks the
composed node tree instead: each `Fields` wraps one mapping node with its
dotted path, and every accessor checks the type and reports the node's own
line (1-based, as editors count).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_INTEGER_DIGITS = 20
_INT_TAG = "tag:yaml.org,2002:int"
_BOOL_TAG = "tag:yaml.org,2002:bool"
_NULL_TAG = "tag:yaml.org,2002:null"
_STR_TAG = "tag:yaml.org,2002:str"
_FLOAT_TAG = "tag:yaml.org,2002:float"


class RegistryError(ValueError):
    """A registry file was refused; the message names the source, line and field."""

    def __init__(self, source: str, line: int, field: str, problem: str) -> None:
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {field}: {problem}" if field else f"{where}: {problem}")
        self.source = source
        self.line = line
        self.field = field
        self.problem = problem


# libyaml's loader keeps the same marks and is an order of magnitude faster on big registries.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def compose(text: str, source: str) -> Node | None:
    """Parse YAML into a node tree; syntax errors become a `RegistryError` with the line."""
    try:
        return yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 0
        raise RegistryError(source, line, "", f"invalid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise RegistryError(source, 0, "", f"invalid YAML: {exc}") from None


def line_of(node: Node) -> int:
    return node.start_mark.line + 1


def describe(node: Node) -> str:
    """How a wrong value is shown in an error: the scalar itself, or its kind."""
    if isinstance(node, ScalarNode):
        return repr(node.value) if node.tag != _NULL_TAG else "null"
    return "a list" if isinstance(node, SequenceNode) else "a mapping"


def is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == _NULL_TAG


class Fields:
    """One YAML mapping with its path; typed accessors that fail with line and field."""

    def __init__(self, node: Node, path: str, source: str, allowed: frozenset[str] | None = None) -> None:
        self.path = path
        self.source = source
        self.node = node
        if not isinstance(node, MappingNode):
            self.fail(node, "", f"must be a mapping, got {describe(node)}")
        self._items: dict[str, tuple[Node, Node]] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag == _NULL_TAG:
                self.fail(key_node, "", f"keys must be strings, got {describe(key_node)}")
            key = str(key_node.value)
            if key in self._items:
                self.fail(key_node, key, "appears twice")
            if allowed is not None and key not in allowed:
                self.fail(key_node, key, f"unknown field (expected one of: {', '.join(sorted(allowed))})")
            self._items[key] = (key_node, value_node)

    @property
    def line(self) -> int:
        return line_of(self.node)

    def child_path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, node: Node, key: str, problem: str) -> Any:
        raise RegistryError(self.source, line_of(node), self.child_path(key) if key else self.path, problem)

    def has(self, key: str) -> bool:
        return key in self._items and not is_null(self._items[key][1])

    def value_node(self, key: str) -> Node:
        return self._items[key][1]

    def names(self) -> list[str]:
        return list(self._items)

    def string(self, key: str, default: str | None = None) -> str:
        if not self.has(key):
            if default is None:
                self.fail(self.node, key, "is required")
            return default  # type: ignore[return-value]
        node = self._items[key][1]
        if not isinstance(node, ScalarNode) or node.tag not in (_STR_TAG, _INT_TAG, _FLOAT_TAG, _BOOL_TAG):
            self.fail(node, key, f"must be a string, got {describe(node)}")
        return str(node.value)

    def integer(self, key: str, default: int | None = None, low: int | None = None, high: int | None = None) -> int:
        if not self.has(key):
            if default is None:
                self.fail(self.node, key, "is required")
            return default  # type: ignore[return-value]
        node = self._items[key][1]
        if not isinstance(node, ScalarNode) or node.tag != _INT_TAG:
            self.fail(node, key, f"must be an integer, got {describe(node)}")
        text = str(node.value).replace("_", "")
        digits = len(text.lstrip("+-"))
        if digits > MAX_INTEGER_DIGITS:  # int() itself refuses past 4,300 digits, and nothing here needs 20
            bounds = f"between {low} and {high}" if low is not None and high is not None else "an integer"
            self.fail(node, key, f"must be {bounds}, got a number of {digits} digits")
        try:
            value = int(text, 0)
        except ValueError:  # YAML 1.1's other integers: 017 (octal), 1:30 (base 60)
            self.fail(node, key, f"must be a decimal integer, got {text!r}")
        if (low is not None and value < low) or (high is not None and value > high):
            self.fail(node, key, f"must be between {low} and {high}, got {value}")
        return value

    def string_map(self, key: str) -> dict[str, str]:
        """A mapping of strings to strings (labels, selectors); absent means empty."""
        if not self.has(key):
            return {}
        inner = Fields(self._items[key][1], self.child_path(key), self.source)
        return {name: inner.string(name) for name in inner.names()}

    def items(self, key: str, required: bool = False) -> Iterator[tuple[str, Node]]:
        """The elements of a list field as (path, node); absent means empty unless required."""
        if not self.has(key):
            if required:
                self.fail(self.node, key, "is required")
            return
        node = self._items[key][1]
        if not isinstance(node, SequenceNode):
            self.fail(node, key, f"must be a list, got {describe(node)}")
        if required and not node.value:
            self.fail(node, key, "must not be empty")
        for index, item in enumerate(node.value):
            yield f"{self.child_path(key)}[{index}]", item

    def string_list(self, key: str, required: bool = False) -> list[tuple[str, Node, str]]:
        """A list of strings as (path, node, value), for per-element checks with the element's line."""
        out: list[tuple[str, Node, str]] = []
        for path, node in self.items(key, required):
            if not isinstance(node, ScalarNode) or node.tag == _NULL_TAG:
                raise RegistryError(self.source, line_of(node), path, f"must be a string, got {describe(node)}")
            out.append((path, node, str(node.value)))
        return out


DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def dns_label(f: Fields, key: str, default: str | None = None) -> str:
    """A Kubernetes name (RFC 1123 label): names, namespaces, service accounts."""
    value = f.string(key, default)
    if not DNS_LABEL.match(value):
        f.fail(f.value_node(key) if f.has(key) else f.node, key,
               f"must be a DNS label (lowercase letters, digits and '-', at most 63), got {value!r}")
    return value


def namespaced_items(top: Fields, key: str, allowed: frozenset[str], kind: str) -> Iterator[tuple[Fields, str, str]]:
    """Each element of a list of Kubernetes-style objects as (its fields, name, namespace): the name a DNS
    label, the namespace one defaulting to "default", and a namespace/name given twice refused, naming where
    `kind` (e.g. "workload entry") was first defined."""
    seen: dict[tuple[str, str], str] = {}
    for path, node in top.items(key):
        f = Fields(node, path, top.source, allowed)
        name, namespace = dns_label(f, "name"), dns_label(f, "namespace", "default")
        if (namespace, name) in seen:
            f.fail(f.value_node("name"), "name",
                   f"{kind} {namespace}/{name} is already defined at {seen[namespace, name]}")
        seen[namespace, name] = path
        yield f, name, namespace


def choice(f: Fields, key: str, choices: tuple[str, ...], default: str | None = None) -> str:
    """One of a fixed set of spellings, exactly as written."""
    value = f.string(key, default)
    if value not in choices:
        f.fail(f.value_node(key), key, f"must be one of {', '.join(choices)}, got {value!r}")
    return value


def ip_address(f: Fields, key: str, version: int | None = None) -> str:
    """An optional IP address (of `version` 4 or 6 only, when given), normalised; "" when absent."""
    text = f.string(key, "")
    if not text:
        return ""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        address = None
    if address is None or (version is not None and address.version != version):
        kind = f"an IPv{version}" if version else "an IP"
        f.fail(f.value_node(key), key, f"must be {kind} address, got {text!r}")
    return str(address)


def protocol_from_name(name: str) -> str:
    """Istio's port-name convention (`http-web`, `grpc`); anything else is TCP here (no sniffing)."""
    return {"http": "HTTP", "http2": "HTTP2", "grpc": "GRPC"}.get(name.split("-", 1)[0].lower(), "TCP")
