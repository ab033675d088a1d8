"""Request bodies decoded as the apiserver's JSON decoder takes them (pure).

Go's decoder, unlike Python's, refuses `NaN`, `Infinity` and `-Infinity` (JSON
has no such numbers): a stored NaN would be served back as text no Go client
can decode (`kubectl get -o json` fails on it). Bodies must be UTF-8. Nesting
is bounded: what is stored must be walked (patched, checked, encoded) by
recursive code, and Kubernetes objects are shallow (a Pod's deepest field is
about a dozen levels down); a body nested deeper than `MAX_DEPTH` is refused
before anything walks it, as Go's decoder refuses one past its own bound.
"""

from __future__ import annotations

import json
from typing import Any

from istiod_local.controlplane.kubeapi import errors

MAX_DEPTH = 100


class _NotJson(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NotJson(f"invalid character '{name.lstrip('-')[0]}' looking for beginning of value")


def depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """How deeply `value` nests (a scalar: 0), counted up to `limit + 1` (deeper is not walked)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        level += 1
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        stack.extend((child, level) for child in children)
    return deepest


def decode(raw: bytes, what: str = "the request body") -> Any:
    """The JSON value of `raw`; ApiError 400 naming what is wrong with it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise errors.bad_request(f"error decoding {what}: invalid UTF-8 at byte {exc.start}") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except _NotJson as exc:
        raise errors.bad_request(f"error decoding {what}: {exc}") from None
    except RecursionError:
        raise errors.bad_request(f"error decoding {what}: exceeded max depth of {MAX_DEPTH}") from None
    except ValueError as exc:
        raise errors.bad_request(f"error decoding {what}: {exc}") from None
    if depth(value) > MAX_DEPTH:
        raise errors.bad_request(f"error decoding {what}: exceeded max depth of {MAX_DEPTH}")
    return value
