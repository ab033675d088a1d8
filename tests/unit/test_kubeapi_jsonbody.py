"""Request bodies decoded as the apiserver's Go decoder takes them: no NaN or Infinity, UTF-8 only, bounded
nesting, each refusal a 400 naming what is wrong (they were stored, or a 500 RecursionError)."""

from __future__ import annotations

import pytest

from istiod_local.controlplane.kubeapi import jsonbody
from istiod_local.controlplane.kubeapi.errors import ApiError


def refused(raw: bytes) -> ApiError:
    with pytest.raises(ApiError) as caught:
        jsonbody.decode(raw, "patch")
    assert caught.value.code == 400 and caught.value.reason == "BadRequest"
    return caught.value


@pytest.mark.parametrize(("raw", "character"), [(b'{"status":{"x":NaN}}', "N"), (b'[Infinity]', "I"),
                                                (b'{"a":-Infinity}', "I")])
def test_nan_and_infinity_are_refused_as_go_refuses_them(raw: bytes, character: str) -> None:
    assert refused(raw).message == f"error decoding patch: invalid character '{character}' looking for beginning of " \
                                   "value"


def test_deep_nesting_is_400_not_a_recursion_error() -> None:
    assert "exceeded max depth" in refused(b"[" * 100_000 + b"]" * 100_000).message
    assert "exceeded max depth" in refused(b'{"a":' * 101 + b"1" + b"}" * 101).message
    assert jsonbody.decode(b'{"a":' * 99 + b"1" + b"}" * 99) is not None


def test_invalid_utf8_and_broken_json_are_400() -> None:
    assert "invalid UTF-8" in refused(b'{"a":"\xff"}').message
    assert refused(b'{"a":').message.startswith("error decoding patch: ")


def test_depth_counts_containers_and_stops_early() -> None:
    assert jsonbody.depth(1) == 0 and jsonbody.depth({"a": [1, {"b": []}]}) == 4
    deep: list[object] = []
    node = deep
    for _ in range(10_000):
        child: list[object] = []
        node.append(child)
        node = child
    assert jsonbody.depth(deep, limit=50) == 51
