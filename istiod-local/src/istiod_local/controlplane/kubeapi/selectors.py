"""Label and field selectors, parsed and matched as the Kubernetes API server does (pure).

Label selectors take the full set-based grammar (`a=b`, `a==b`, `a!=b`,
`a in (x,y)`, `a notin (x)`, `a`, `!a`); field selectors the equality
subset (`f=v`, `f==v`, `f!=v`) over the fields each kind supports, and any
other field is refused with the apiserver's own words (`field label not
supported: ...`), which clients show as a 400 BadRequest.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


class SelectorError(ValueError):
    """A selector that does not parse or names an unsupported field; the message is the apiserver's."""


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.operator == "=":
            return present and value == self.values[0]
        if self.operator == "!=":
            return not present or value != self.values[0]
        if self.operator == "in":
            return present and value in self.values
        if self.operator == "notin":
            return not present or value not in self.values
        if self.operator == "exists":
            return present
        return not present  # "!"


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses (`a in (x,y),b` is two requirements)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _check_key(key: str, whole: str) -> str:
    if not _KEY.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
        raise SelectorError(f"unable to parse requirement: invalid label key {key!r} in {whole!r}")
    return key


def _check_value(value: str, whole: str) -> str:
    if len(value) > 63 or not _VALUE.match(value):
        raise SelectorError(f"unable to parse requirement: invalid label value {value!r} in {whole!r}")
    return value


_SET = re.compile(r"^\s*(\S+?)\s+(in|notin)\s*\((.*)\)\s*$")


def _requirement(part: str, whole: str) -> Requirement:
    text = part.strip()
    if not text:
        raise SelectorError(f"unable to parse requirement: found '', expected: identifier in {whole!r}")
    match = _SET.match(text)
    if match:
        key, op, inner = match.groups()
        values = tuple(_check_value(v.strip(), whole) for v in inner.split(","))
        return Requirement(_check_key(key, whole), op, tuple(sorted(set(values))))
    for op in ("==", "!=", "="):
        if op in text:
            key, _, value = text.partition(op)
            return Requirement(_check_key(key.strip(), whole), "=" if op == "==" else op,
                               (_check_value(value.strip(), whole),))
    if text.startswith("!"):
        return Requirement(_check_key(text[1:].strip(), whole), "!")
    return Requirement(_check_key(text, whole), "exists")


def parse_label_selector(text: str) -> LabelSelector:
    """`labelSelector=` as the apiserver reads it; empty selects everything."""
    if not text.strip():
        return LabelSelector()
    return LabelSelector(tuple(_requirement(p, text) for p in _split_top(text)))


# The fields each kind can be selected on (the apiserver's field label conversion for core/v1).
FieldGetter = Callable[[Mapping[str, Any]], str]


def path_getter(*keys: str) -> FieldGetter:
    def get(obj: Mapping[str, Any]) -> str:
        value: Any = obj
        for key in keys:
            value = value.get(key) if isinstance(value, Mapping) else None
        if isinstance(value, bool):
            return "true" if value else "false"
        return "" if value is None else str(value)
    return get


POD_FIELDS: dict[str, FieldGetter] = {
    "metadata.name": path_getter("metadata", "name"),
    "metadata.namespace": path_getter("metadata", "namespace"),
    "spec.nodeName": path_getter("spec", "nodeName"),
    "spec.restartPolicy": path_getter("spec", "restartPolicy"),
    "spec.schedulerName": path_getter("spec", "schedulerName"),
    "spec.serviceAccountName": path_getter("spec", "serviceAccountName"),
    "spec.hostNetwork": lambda o: "true" if (o.get("spec") or {}).get("hostNetwork") else "false",
    "status.phase": path_getter("status", "phase"),
    "status.podIP": path_getter("status", "podIP"),
    "status.nominatedNodeName": path_getter("status", "nominatedNodeName"),
}
NAMESPACE_FIELDS: dict[str, FieldGetter] = {
    "metadata.name": path_getter("metadata", "name"),
    "metadata.namespace": path_getter("metadata", "namespace"),
    "status.phase": path_getter("status", "phase"),
}


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    operator: str  # "=" or "!="
    value: str
    getter: FieldGetter

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return (self.getter(obj) == self.value) == (self.operator == "=")


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all(r.matches(obj) for r in self.requirements)

    def value_of(self, field: str) -> str | None:
        """The value an `=` requirement pins `field` to (for indexed lookups), else None."""
        for r in self.requirements:
            if r.field == field and r.operator == "=":
                return r.value
        return None


def parse_field_selector(text: str, fields: Mapping[str, FieldGetter]) -> FieldSelector:
    """`fieldSelector=`: equality only; an unknown field is refused as the apiserver refuses it."""
    if not text.strip():
        return FieldSelector()
    out = []
    for part in text.split(","):
        part = part.strip()
        for op in ("==", "!=", "="):
            if op in part:
                field, _, value = part.partition(op)
                break
        else:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{part}'")
        field = field.strip()
        if field not in fields:
            raise SelectorError(f"field label not supported: {field}")
        out.append(FieldRequirement(field, "!=" if op == "!=" else "=", value.strip(), fields[field]))
    return FieldSelector(tuple(out))
