"""A Pod's fields and their types, checked as the apiserver's strict decoding checks them (pure).

The apiserver decodes every write into the Pod's Go type: a field the type
does not declare is dropped (with a warning, `fieldValidation=Warn`, the
default), dropped silently (`Ignore`) or refused (`Strict`), and a value of the
wrong JSON type is refused whatever the directive. Stored objects therefore
only ever hold the Pod's own fields, which every client can decode again.

The field table (`pod_schema.json`) is generated from the official
`kubernetes` client's models (`python -m istiod_local.controlplane.kubeapi.schema`
rewrites it; a test checks it is in sync with the installed client). Types are
the client's spellings: a model name (`V1PodSpec`), `List[T]`, `Dict[str, T]`,
`str`, `int`, `bool`, `datetime`, and `object` for free-form values
(IntOrString, `fieldsV1`), which are not looked into.

String fields also take JSON numbers: resource quantities (`cpu: 1`) are
strings in the client's models and numbers or strings in the apiserver's.
No field takes NaN or an infinity (JSON has none; `jsonbody` refuses them
first, this is the second line).
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

SCHEMA_FILE = Path(__file__).with_name("pod_schema.json")
ROOT = "V1Pod"
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
_LIST = re.compile(r"^List\[(.+)\]$")
_DICT = re.compile(r"^Dict\[str, (.+)\]$")


@dataclass(frozen=True)
class TypeMismatch:
    """A value of the wrong JSON type, at `field` (`spec.containers[0].ports`)."""

    field: str
    expected: str  # what the field holds, in words
    got: str

    def __str__(self) -> str:
        return f"{self.field}: Invalid value: {self.got}: must be {self.expected}"


@dataclass(frozen=True)
class Checked:
    """An object with its unknown fields dropped (the same object when nothing was), and what was wrong."""

    object: Any
    unknown: tuple[str, ...]  # the dropped fields' paths, as the apiserver names them in its warnings
    mismatches: tuple[TypeMismatch, ...]


@cache
def types() -> dict[str, dict[str, str]]:
    """Model name -> {JSON field name: type}."""
    loaded: dict[str, dict[str, str]] = json.loads(SCHEMA_FILE.read_text())
    return loaded


def check(value: Any, root: str = ROOT) -> Checked:
    """`value` against the `root` model: unknown fields dropped and listed, wrong types listed."""
    unknown: list[str] = []
    mismatches: list[TypeMismatch] = []
    out = _walk(value, root, "", types(), unknown, mismatches)
    return Checked(out, tuple(unknown), tuple(mismatches))


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _walk(value: Any, kind: str, path: str, table: dict[str, dict[str, str]], unknown: list[str],
          mismatches: list[TypeMismatch]) -> Any:
    if value is None:
        return None
    if kind == "object":
        return value
    if kind in ("str", "int", "bool", "datetime"):
        _scalar(value, kind, path, mismatches)
        return value
    inner = _LIST.match(kind)
    if inner is not None:
        if not isinstance(value, list):
            mismatches.append(TypeMismatch(path, "an array", _json_type(value)))
            return value
        items = [_walk(item, inner.group(1), f"{path}[{i}]", table, unknown, mismatches)
                 for i, item in enumerate(value)]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    inner = _DICT.match(kind)
    if inner is not None:
        if not isinstance(value, dict):
            mismatches.append(TypeMismatch(path, "an object", _json_type(value)))
            return value
        entries = {k: _walk(v, inner.group(1), f"{path}[{k}]", table, unknown, mismatches) for k, v in value.items()}
        return value if all(entries[k] is v for k, v in value.items()) else entries
    fields = table[kind]
    if not isinstance(value, dict):
        mismatches.append(TypeMismatch(path, "an object", _json_type(value)))
        return value
    out: dict[str, Any] = {}
    changed = False
    for key, item in value.items():
        field_path = f"{path}.{key}" if path else key
        field_kind = fields.get(key)
        if field_kind is None:
            unknown.append(field_path)
            changed = True
            continue
        checked = _walk(item, field_kind, field_path, table, unknown, mismatches)
        changed = changed or checked is not item
        out[key] = checked
    return out if changed else value


def _scalar(value: Any, kind: str, path: str, mismatches: list[TypeMismatch]) -> None:
    if kind == "bool":
        if not isinstance(value, bool):
            mismatches.append(TypeMismatch(path, "a boolean", _json_type(value)))
    elif kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            mismatches.append(TypeMismatch(path, "an integer", json.dumps(value) if isinstance(value, float)
                                           else _json_type(value)))
    elif kind == "datetime":
        if not isinstance(value, str) or not _RFC3339.match(value):
            mismatches.append(TypeMismatch(path, "an RFC 3339 time", json.dumps(value) if isinstance(value, str)
                                           else _json_type(value)))
    elif isinstance(value, float) and not math.isfinite(value):
        mismatches.append(TypeMismatch(path, "a finite number or a string", json.dumps(value)))
    elif isinstance(value, bool) or not isinstance(value, str | int | float):
        mismatches.append(TypeMismatch(path, "a string", _json_type(value)))


# ---- generation -----------------------------------------------------------------------------------


def generate() -> dict[str, dict[str, str]]:
    """The table from the installed `kubernetes` client's models (V1Pod and every model it reaches)."""
    from kubernetes.client import models  # a test and tooling dependency, never loaded when serving

    table: dict[str, dict[str, str]] = {}
    pending = [ROOT]
    while pending:
        name = pending.pop()
        if name in table:
            continue
        model = getattr(models, name)
        table[name] = {model.attribute_map[attr]: kind for attr, kind in model.openapi_types.items()}
        for kind in table[name].values():
            pending += [ref for ref in re.findall(r"[A-Za-z0-9]+", kind) if hasattr(models, ref)]
    return {name: dict(sorted(fields.items())) for name, fields in sorted(table.items())}


def render(table: dict[str, dict[str, str]]) -> str:
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    SCHEMA_FILE.write_text(render(generate()))
    sys.stdout.write(f"wrote {SCHEMA_FILE} ({len(types.__wrapped__())} models)\n")
