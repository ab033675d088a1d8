"""The three PATCH formats: RFC 7386 merge, Kubernetes' strategic merge, RFC 6902 JSON patch."""

from __future__ import annotations

from typing import Any

import pytest

from istiod_local.controlplane.kubeapi.patch import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    PatchError,
    PatchLimits,
    PatchTooLarge,
    apply_patch,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)

POD: dict[str, Any] = {
    "metadata": {"name": "p", "labels": {"app": "echo", "drop": "me"}},
    "spec": {"containers": [
        {"name": "app", "image": "a:1", "env": [{"name": "A", "value": "1"}]},
        {"name": "istio-proxy", "image": "proxy:1", "env": [{"name": "X", "value": "x"}, {"name": "Y", "value": "y"}]},
    ]},
}


def test_merge_patch_merges_maps_removes_nulls_and_replaces_lists() -> None:
    out = merge_patch(POD, {"metadata": {"labels": {"new": "1", "drop": None}},
                            "spec": {"containers": [{"name": "only"}]}})
    assert out["metadata"]["labels"] == {"app": "echo", "new": "1"}
    assert out["spec"]["containers"] == [{"name": "only"}]
    assert POD["metadata"]["labels"]["drop"] == "me"  # the input is untouched


def test_strategic_merge_merges_containers_and_env_by_name() -> None:
    out = strategic_merge_patch(POD, {"spec": {"containers": [
        {"name": "istio-proxy", "env": [{"name": "Y", "value": "changed"}, {"name": "Z", "value": "z"}]},
        {"name": "extra", "image": "e:1"}]}})
    containers = {c["name"]: c for c in out["spec"]["containers"]}
    assert list(containers) == ["app", "istio-proxy", "extra"]
    assert containers["istio-proxy"]["image"] == "proxy:1"
    assert containers["istio-proxy"]["env"] == [{"name": "X", "value": "x"}, {"name": "Y", "value": "changed"},
                                                {"name": "Z", "value": "z"}]
    assert containers["app"] == POD["spec"]["containers"][0]


def test_strategic_merge_directives() -> None:
    out = strategic_merge_patch(POD, {"spec": {"containers": [{"name": "app", "$patch": "delete"}]},
                                      "$setElementOrder/containers": [{"name": "istio-proxy"}]})
    assert [c["name"] for c in out["spec"]["containers"]] == ["istio-proxy"]
    replaced = strategic_merge_patch(POD, {"metadata": {"labels": {"$patch": "replace", "only": "1"}}})
    assert replaced["metadata"]["labels"] == {"only": "1"}
    with pytest.raises(PatchError, match="merge key 'name'"):
        strategic_merge_patch(POD, {"spec": {"containers": [{"image": "x"}]}})


def test_json_patch_operations() -> None:
    out = json_patch(POD, [
        {"op": "add", "path": "/metadata/labels/cni.istio.io~1uninitialized", "value": "true"},
        {"op": "replace", "path": "/spec/containers/0/image", "value": "a:2"},
        {"op": "remove", "path": "/metadata/labels/drop"},
        {"op": "test", "path": "/metadata/name", "value": "p"},
        {"op": "add", "path": "/spec/containers/1/env/-", "value": {"name": "W", "value": "w"}},
        {"op": "copy", "from": "/metadata/name", "path": "/metadata/labels/name"},
        {"op": "move", "from": "/metadata/labels/app", "path": "/metadata/labels/application"},
    ])
    assert out["metadata"]["labels"] == {"cni.istio.io/uninitialized": "true", "name": "p", "application": "echo"}
    assert out["spec"]["containers"][0]["image"] == "a:2"
    assert out["spec"]["containers"][1]["env"][-1] == {"name": "W", "value": "w"}
    assert POD["spec"]["containers"][0]["image"] == "a:1"


@pytest.mark.parametrize(("ops", "problem"), [
    ([{"op": "test", "path": "/metadata/name", "value": "other"}], "test failed"),
    ([{"op": "remove", "path": "/metadata/nope"}], "does not exist"),
    ([{"op": "replace", "path": "/spec/containers/9/image", "value": "x"}], "does not exist"),
    ([{"op": "add", "path": "/spec/containers/9", "value": {}}], "out of range"),
    ([{"op": "frobnicate", "path": "/a"}], "unknown operation"),
    ([{"op": "add", "path": "/a"}], "needs 'value'"),
    ({"op": "add"}, "array of operations"),
])
def test_json_patch_failures_name_the_problem(ops: Any, problem: str) -> None:
    with pytest.raises(PatchError, match=problem):
        json_patch(POD, ops)


def test_apply_patch_dispatches_on_the_content_type() -> None:
    body = {"metadata": {"labels": {"k": "v"}}}
    assert apply_patch(MERGE_PATCH, POD, body)["metadata"]["labels"]["k"] == "v"
    assert apply_patch(f"{STRATEGIC_MERGE_PATCH}; charset=utf-8", POD, body)["metadata"]["labels"]["k"] == "v"
    assert apply_patch(JSON_PATCH, POD, [{"op": "add", "path": "/metadata/labels/k", "value": "v"}])[
        "metadata"]["labels"]["k"] == "v"
    with pytest.raises(PatchError, match="unknown format"):
        apply_patch("application/apply-patch+yaml", POD, body)


def test_copies_are_bounded_by_the_size_they_add_before_the_document_grows() -> None:
    copies = [{"op": "copy", "from": "", "path": f"/x{n}"} for n in range(20)]
    with pytest.raises(PatchError, match=r"accumulated size increase of copy is \d+, exceeding the limit 3145728"):
        json_patch(POD, copies)  # each copy of the root doubles it: 2**20 times the pod otherwise
    small = json_patch({"a": 1}, copies[:3], PatchLimits(max_copy_bytes=100))
    assert set(small) == {"a", "x0", "x1", "x2"}
    with pytest.raises(PatchError, match="limit 40"):
        json_patch({"a": 1}, copies[:4], PatchLimits(max_copy_bytes=40))


def test_more_operations_than_the_apiserver_allows_are_refused_before_any_is_applied() -> None:
    with pytest.raises(PatchTooLarge, match="The allowed maximum operations in a JSON patch is 10000, got 10001"):
        json_patch(POD, [{"op": "add", "path": "/x", "value": 1}] * 10_001)


def test_moves_that_nest_a_document_ever_deeper_end_in_a_patch_error_not_a_recursion_error() -> None:
    ops: list[dict[str, Any]] = []
    for n in range(3000):  # each step wraps what the last built one level deeper
        ops += [{"op": "add", "path": f"/w{n}", "value": {}},
                {"op": "move", "from": "/a" if n == 0 else f"/w{n - 1}", "path": f"/w{n}/inner"}]
    deep = apply_patch(JSON_PATCH, {"a": {}}, ops)  # moves copy nothing: built without recursion
    assert list(deep) == ["w2999"]
    with pytest.raises(PatchError, match="nested too deeply"):
        apply_patch(JSON_PATCH, {"a": {}}, [*ops, {"op": "copy", "from": "/w2999", "path": "/again"}])


def test_json_patch_copies_on_write_shares_what_it_does_not_change_and_never_aliases_a_copy() -> None:
    target = {"a": {"list": [1, 2], "deep": {"x": 1}}, "b": {"untouched": True}}
    ops = [{"op": "copy", "from": "/a", "path": "/c"},
           {"op": "add", "path": "/c/deep/x", "value": 2},  # the copy changes, the original does not
           {"op": "add", "path": "/a/list/-", "value": 3},
           {"op": "copy", "from": "", "path": "/self"},  # the root into itself: a snapshot, not a cycle
           {"op": "add", "path": "/self/b/untouched", "value": False}]
    out = json_patch(target, ops)
    assert out["a"] == {"list": [1, 2, 3], "deep": {"x": 1}} and out["c"] == {"list": [1, 2], "deep": {"x": 2}}
    assert out["self"]["c"]["deep"]["x"] == 2 and "self" not in out["self"]
    assert out["b"] == {"untouched": True} and out["self"]["b"] == {"untouched": False}
    assert out["b"] is target["b"], "what no operation touched is shared with the target"
    assert target == {"a": {"list": [1, 2], "deep": {"x": 1}}, "b": {"untouched": True}}, "the target is unchanged"


def test_copies_within_the_budget_cost_no_memory_of_their_own() -> None:
    big = {"blob": "x" * 100_000}
    out = json_patch(big, [{"op": "copy", "from": "/blob", "path": f"/c{n}"} for n in range(30)])
    assert all(out[f"c{n}"] is big["blob"] for n in range(30))
