"""The three patch formats a Kubernetes API server accepts for PATCH (pure, on JSON-shaped data).

- `application/merge-patch+json` (RFC 7386): maps merge, `null` removes, lists replace.
- `application/strategic-merge-patch+json`: as merge, but the lists Kubernetes
  declares with a merge key (containers and env by `name`, ports by
  `containerPort`, conditions by `type`, ...) merge element by element, and
  `$patch: delete` / `$patch: replace` directives work; `$setElementOrder/`
  and `$retainKeys` hints are accepted and ignored.
- `application/json-patch+json` (RFC 6902): add, remove, replace, test, move, copy.

Every function returns a new object and never changes its inputs; a patch
that cannot apply raises `PatchError` with a message for the 4xx Status.

A JSON patch is bounded as the apiserver bounds it: at most 10,000 operations
(`PatchTooLarge`, a 413), and `copy` operations may add at most 3 MiB in all
(their values' JSON sizes summed), since each copy can double the document:
twenty copies of the root would otherwise grow a Pod past a gigabyte.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_TYPES = (MERGE_PATCH, STRATEGIC_MERGE_PATCH, JSON_PATCH)

# Field name -> merge key, for the Pod's lists (k8s.io/api/core/v1 `patchMergeKey` tags).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "conditions": "type",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "ephemeralContainerStatuses": "name",
    "podIPs": "ip",
    "hostIPs": "ip",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "resourceClaims": "name",
    "readinessGates": "conditionType",
    "topologySpreadConstraints": "topologyKey",
}
_DIRECTIVE = "$patch"


MAX_OPERATIONS = 10_000  # the apiserver's maxJSONPatchOperations
MAX_COPY_BYTES = 3 * 1024 * 1024  # the apiserver's JSONPatchMaxCopyBytes


@dataclass(frozen=True)
class PatchLimits:
    max_operations: int = MAX_OPERATIONS
    max_copy_bytes: int = MAX_COPY_BYTES


class PatchError(ValueError):
    """A patch that cannot be applied (bad document, failed test, missing path)."""


class PatchTooLarge(PatchError):
    """A JSON patch with more operations than allowed (the apiserver answers 413)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Kubernetes' strategic merge patch for Pod-shaped data (merge keys as in MERGE_KEYS)."""
    return _smp(target, patch)


def _smp(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    if patch.get(_DIRECTIVE) == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != _DIRECTIVE}
    if patch.get(_DIRECTIVE) == "delete":
        return None
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if key == _DIRECTIVE or key.startswith(("$setElementOrder/", "$deleteFromPrimitiveList/")) \
                or key == "$retainKeys":
            continue
        if value is None:
            out.pop(key, None)
        elif isinstance(value, list) and key in MERGE_KEYS:
            out[key] = _merge_list(out.get(key), value, MERGE_KEYS[key])
        elif isinstance(value, Mapping):
            merged = _smp(out.get(key), value)
            if merged is None:
                out.pop(key, None)
            else:
                out[key] = merged
        else:
            out[key] = copy.deepcopy(value)
    return out


def _merge_list(target: Any, patch: list[Any], key: str) -> list[Any]:
    current = [copy.deepcopy(item) for item in target] if isinstance(target, list) else []
    if any(isinstance(item, Mapping) and item.get(_DIRECTIVE) == "replace" for item in patch):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, Mapping) and i.get(_DIRECTIVE) == "replace")]
    for item in patch:
        if not isinstance(item, Mapping) or key not in item:
            raise PatchError(f"strategic merge patch: list element {item!r} has no merge key {key!r}")
        index = next((i for i, existing in enumerate(current)
                      if isinstance(existing, Mapping) and existing.get(key) == item[key]), None)
        if item.get(_DIRECTIVE) == "delete":
            if index is not None:
                del current[index]
        elif index is None:
            current.append(_smp({}, item))
        else:
            current[index] = _smp(current[index], item)
    return current


# ---- RFC 6902 -------------------------------------------------------------------------------------


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchError(f"json patch: invalid path {path!r}")
    if path == "":
        return []
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _index(node: list[Any], part: str, path: str, adding: bool) -> int:
    if adding and part == "-":
        return len(node)
    if not part.isdigit():
        raise PatchError(f"json patch: {part!r} in {path!r} is not an array index")
    index = int(part)
    if index > len(node) or (not adding and index == len(node)):
        raise PatchError(f"json patch: index {index} in {path!r} is out of range")
    return index


def _child(node: Any, part: str, path: str) -> Any:
    if isinstance(node, dict) and part in node:
        return node[part]
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    raise PatchError(f"json patch: path {path!r} does not exist")


class _Document:
    """The document being patched, copied on write: the target is never changed, and a container is copied
    the first time an operation changes it (or anything below it), then changed in place.

    `copy` shares the copied value instead of copying it (copies cost their size in the budget, not in
    memory); a shared value is no longer "owned", so a later change anywhere inside it copies the path
    from there down and the other place that holds it keeps the old value."""

    def __init__(self, target: Any) -> None:
        self.root = target
        self._owned: set[int] = set()  # ids of containers made by this patch and held in one place only
        # Encoded sizes of containers no operation can change any more (never owned): a copy of a copy of the
        # root is measured by its new top level, not by encoding all of it again.
        self._sizes: dict[int, tuple[Any, int]] = {}

    def size(self, value: Any) -> int:
        """`value`'s compact JSON size in bytes (UTF-8), as the apiserver measures a copy."""
        if isinstance(value, str):
            return len(encode_basestring(value).encode())
        if isinstance(value, bool) or value is None:
            return 4 if value is not False else 5
        if isinstance(value, int | float):
            return len(json.dumps(value))
        found = self._sizes.get(id(value))
        if found is not None and found[0] is value:
            return found[1]
        separators = max(len(value) - 1, 0)  # commas; a dict has a colon per entry too
        if isinstance(value, dict):
            total = 2 + separators + sum(self.size(k) + 1 + self.size(v) for k, v in value.items())
        else:
            total = 2 + separators + sum(self.size(v) for v in value)
        if id(value) not in self._owned:
            self._sizes[id(value)] = (value, total)
        return total

    def _writable(self, node: Any, copied_above: bool) -> tuple[Any, bool]:
        if id(node) in self._owned and not copied_above:
            return node, False
        fresh = dict(node) if isinstance(node, dict) else list(node)
        self._owned.add(id(fresh))
        return fresh, True

    def _parent(self, parts: list[str], path: str) -> Any:
        """The container that holds the path's last part, writable (PatchError when the path does not exist)."""
        if not isinstance(self.root, dict | list):
            raise PatchError(f"json patch: path {path!r} does not exist")
        node, copied = self._writable(self.root, False)
        self.root = node
        for part in parts[:-1]:
            child = _child(node, part, path)
            if not isinstance(child, dict | list):
                raise PatchError(f"json patch: path {path!r} does not exist")
            child, copied = self._writable(child, copied)
            node[int(part) if isinstance(node, list) else part] = child
            node = child
        return node

    def get(self, path: str) -> Any:
        node = self.root
        for part in _pointer(path):
            node = _child(node, part, path)
        return node

    def add(self, path: str, value: Any) -> None:
        parts = _pointer(path)
        if not parts:
            self.root = value
            return
        parent, last = self._parent(parts, path), parts[-1]
        if isinstance(parent, dict):
            parent[last] = value
        else:
            parent.insert(_index(parent, last, path, True), value)

    def remove(self, path: str) -> Any:
        """Remove and return the value at `path`."""
        parts = _pointer(path)
        if not parts:
            raise PatchError("json patch: cannot remove the whole document")
        parent, last = self._parent(parts, path), parts[-1]
        if isinstance(parent, dict):
            if last not in parent:
                raise PatchError(f"json patch: path {path!r} does not exist")
            return parent.pop(last)
        return parent.pop(_index(parent, last, path, False))

    def share(self, value: Any) -> None:
        """`value` is about to be held in a second place: nothing may change it in place any more."""
        self._owned.discard(id(value))


def json_patch(target: Any, operations: Any, limits: PatchLimits = PatchLimits()) -> Any:
    """RFC 6902 on `target`, which is left as it was (the result shares what the patch did not change)."""
    if not isinstance(operations, list):
        raise PatchError("json patch: the body must be an array of operations")
    if len(operations) > limits.max_operations:
        raise PatchTooLarge(f"The allowed maximum operations in a JSON patch is {limits.max_operations}, "
                            f"got {len(operations)}")
    doc = _Document(target)
    copied = 0
    for number, op in enumerate(operations):
        if not isinstance(op, Mapping) or "op" not in op or "path" not in op:
            raise PatchError(f"json patch: operation {number} needs 'op' and 'path'")
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(f"json patch: operation {number} ({kind}) needs 'value'")
        if kind == "add":
            doc.add(path, op["value"])  # the body's own value: held in this one place
        elif kind == "remove":
            doc.remove(path)
        elif kind == "replace":
            doc.get(path)
            if _pointer(path):
                doc.remove(path)
            doc.add(path, op["value"])
        elif kind == "test":
            if doc.get(path) != op["value"]:
                raise PatchError(f"json patch: test failed at {path!r}")
        elif kind in ("move", "copy"):
            source = op.get("from")
            if not isinstance(source, str):
                raise PatchError(f"json patch: operation {number} ({kind}) needs 'from'")
            if kind == "copy":
                value = doc.get(source)
                copied += doc.size(value)
                if copied > limits.max_copy_bytes:
                    raise PatchError(f"Unable to complete the copy, the accumulated size increase of copy is "
                                     f"{copied}, exceeding the limit {limits.max_copy_bytes}")
                doc.share(value)
            else:  # moved: the value itself changes place
                value = doc.remove(source)
            doc.add(path, value)
        else:
            raise PatchError(f"json patch: unknown operation {kind!r}")
    return doc.root


def apply_patch(content_type: str, target: Any, body: Any, limits: PatchLimits = PatchLimits()) -> Any:
    """Dispatch on the request's Content-Type (parameters after `;` ignored)."""
    kind = content_type.split(";", 1)[0].strip().lower()
    try:
        if kind == MERGE_PATCH:
            return merge_patch(target, body)
        if kind == STRATEGIC_MERGE_PATCH:
            return strategic_merge_patch(target, body)
        if kind == JSON_PATCH:
            return json_patch(target, body, limits)
    except RecursionError:  # `move`/`copy` can nest a document ever deeper
        raise PatchError("the patched object is nested too deeply") from None
    raise PatchError(f"the body of the request was in an unknown format - accepted media types include: "
                     f"{', '.join(PATCH_TYPES)}")
