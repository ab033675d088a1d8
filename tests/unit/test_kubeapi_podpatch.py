"""A PATCH worked out from the stored pod alone (off the server's loop), then committed: the apiserver's bounds
(object size, nesting), strict decoding (unknown fields warned, refused or ignored; wrong types refused), and a
commit that finds the pod changed since."""

from __future__ import annotations

import json
from typing import Any

import pytest

from istiod_local.controlplane.kubeapi.errors import ApiError
from istiod_local.controlplane.kubeapi.patch import JSON_PATCH, MERGE_PATCH
from istiod_local.controlplane.kubeapi.podpatch import check_field_validation, patch_pod_object
from istiod_local.controlplane.kubeapi.store import PODS, KubeStore, StaleObject
from istiod_local.controlplane.xds.registry import parse_registry

MESH = "workloads:\n- {name: a, labels: {app: a}, ip: 10.0.0.1}\n"


def _store(**options: Any) -> KubeStore:
    store = KubeStore("node", **options)
    store.apply_registry(parse_registry(MESH), "2026-12-01T12:00:00Z")
    return store


def _refusal(old: dict[str, Any], body: Any, content_type: str = MERGE_PATCH, **options: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        patch_pod_object(old, "a", content_type, body, **options)
    return caught.value


def test_the_encoded_result_carries_the_committed_resource_version() -> None:
    store = _store()
    old = store.get(PODS, "default", "a")
    patched = patch_pod_object(old, "a", MERGE_PATCH, {"metadata": {"labels": {"x": "1"}}})
    assert patched.object["metadata"]["resourceVersion"] == old["metadata"]["resourceVersion"]
    new = store.commit_patch("default", "a", old, patched)
    assert json.loads(patched.encoded(new["metadata"]["resourceVersion"])) == new


def test_an_object_over_etcds_request_limit_is_413_naming_it() -> None:
    old = _store().get(PODS, "default", "a")
    refused = _refusal(old, {"status": {"message": "x" * 1_600_000}}, subresource="status")
    assert (refused.code, refused.reason) == (413, "RequestEntityTooLarge")
    assert refused.message.startswith("Request entity too large: limit is 1572864: the patched Pod would be ")
    assert patch_pod_object(old, "a", MERGE_PATCH, {"status": {"message": "x" * 1_000_000}}, "status").template


def test_a_json_patch_of_copies_is_422_and_too_many_operations_413() -> None:
    old = _store().get(PODS, "default", "a")
    copies = [{"op": "copy", "from": "", "path": f"/x{n}"} for n in range(20)]
    assert _refusal(old, copies, JSON_PATCH).code == 422
    too_many = _refusal(old, [{"op": "test", "path": "/kind", "value": "Pod"}] * 10_001, JSON_PATCH)
    assert (too_many.code, too_many.reason) == (413, "RequestEntityTooLarge")


def test_a_result_nested_past_the_bound_is_refused() -> None:
    old = _store().get(PODS, "default", "a")
    ops: list[dict[str, Any]] = [{"op": "add", "path": "/spec/containers/0/deep", "value": {}}]
    path = "/spec/containers/0/deep"
    for _ in range(150):  # one level at a time: no single value in the body is deep
        path += "/n"
        ops.append({"op": "add", "path": path, "value": {}})
    refused = _refusal(old, ops, JSON_PATCH)
    assert refused.code == 422 and "nests deeper than 100 levels" in refused.message


def test_unknown_fields_warn_by_default_are_ignored_or_refused_and_wrong_types_always_refused() -> None:
    old = _store().get(PODS, "default", "a")
    body = {"foo": 1, "metadata": {"bar": 2}, "status": {"x": 1}}
    warned = patch_pod_object(old, "a", MERGE_PATCH, body, "status")
    assert warned.warnings == ('unknown field "metadata.bar"', 'unknown field "status.x"', 'unknown field "foo"')
    assert warned.unchanged and warned.object is old, "nothing a Pod holds changed"
    assert patch_pod_object(old, "a", MERGE_PATCH, body, "status", "Ignore").warnings == ()
    strict = _refusal(old, body, subresource="status", field_validation="Strict")
    assert strict.code == 422 and 'strict decoding error: unknown field "metadata.bar"' in strict.message
    typed = _refusal(old, {"status": {"phase": ["Running"]}}, subresource="status")
    assert typed.code == 422 and "status.phase: Invalid value: array: must be a string" in typed.message
    assert check_field_validation("") == "Warn" and check_field_validation("Strict") == "Strict"
    assert _bad_directive().code == 422


def _bad_directive() -> ApiError:
    with pytest.raises(ApiError) as caught:
        check_field_validation("strict")
    assert 'Unsupported value: "strict": supported values: "", "Ignore", "Strict", "Warn"' in caught.value.message
    return caught.value


def test_a_commit_over_a_pod_changed_since_is_stale_and_the_log_is_bounded_in_bytes() -> None:
    store = _store(history_bytes=3_000_000)
    old = store.get(PODS, "default", "a")
    patched = patch_pod_object(old, "a", MERGE_PATCH, {"status": {"message": "1" * 1_000_000}}, "status")
    store.patch_pod("default", "a", MERGE_PATCH, {"metadata": {"labels": {"b": "2"}}})
    with pytest.raises(StaleObject):
        store.commit_patch("default", "a", old, patched, "status")
    first = store.resource_version
    for n in range(4):  # four 1 MB versions: the log keeps what fits in 3 MB
        store.patch_pod("default", "a", MERGE_PATCH, {"status": {"message": f"{n}" * 1_000_000}}, "status")
    with pytest.raises(ApiError) as expired:
        store.watch_start(PODS, str(first))
    assert expired.value.code == 410
    assert len(store.watch_start(PODS, str(store.resource_version - 2))) == 2
