"""The API's store: resourceVersions, registry reloads as watch events, replay, 410, patches, deletes."""

from __future__ import annotations

from typing import Any

import pytest

from istiod_local.controlplane.kubeapi.errors import ApiError
from istiod_local.controlplane.kubeapi.patch import JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH
from istiod_local.controlplane.kubeapi.selectors import POD_FIELDS, parse_field_selector, parse_label_selector
from istiod_local.controlplane.kubeapi.store import NAMESPACES, PODS, KubeStore, WatchEvent, bookmark, filter_event
from istiod_local.controlplane.xds.registry import parse_registry

NOW = "2026-12-01T12:00:00Z"
LATER = "2026-12-01T13:00:00Z"
MESH = """
workloads:
- {name: a, labels: {app: a}, ip: 10.0.0.1, nodeName: n1}
- {name: b, labels: {app: b}, ip: 10.0.0.2, nodeName: n2}
- {name: c, namespace: apps, ip: 10.0.0.3, nodeName: n1}
"""
CHANGED = """
workloads:
- {name: a, labels: {app: a, version: v2}, ip: 10.0.0.1, nodeName: n1}
- {name: b, labels: {app: b}, ip: 10.0.0.2, nodeName: n2}
- {name: d, ip: 10.0.0.4, nodeName: n1}
"""


def _store(history: int = 1000) -> KubeStore:
    store = KubeStore("default-node", history=history)
    store.apply_registry(parse_registry(MESH), NOW)
    return store


def _names(events: list[WatchEvent]) -> list[tuple[str, str, str]]:
    return [(e.type, e.resource, e.object["metadata"]["name"]) for e in events]


def test_first_load_adds_namespaces_and_pods_with_increasing_versions() -> None:
    store = KubeStore("default-node")
    events = store.apply_registry(parse_registry(MESH), NOW)
    assert {(t, r, n) for t, r, n in _names(events)} == {
        ("ADDED", NAMESPACES, n) for n in ("default", "istio-system", "kube-system", "apps")} | {
        ("ADDED", PODS, n) for n in ("a", "b", "c")} | {
        ("ADDED", "nodes", n) for n in ("default-node", "n1", "n2")}  # the nodes pods name, and the default
    versions = [e.resource_version for e in events]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    pods, rv = store.list_objects(PODS)
    assert rv == versions[-1] == store.resource_version
    assert [p["metadata"]["name"] for p in pods] == ["c", "a", "b"]  # by namespace, then name
    assert all(int(p["metadata"]["resourceVersion"]) <= rv for p in pods)


def test_reload_emits_modified_added_deleted_and_nothing_for_the_same_registry() -> None:
    store = _store()
    assert store.apply_registry(parse_registry(MESH), LATER) == []
    events = store.apply_registry(parse_registry(CHANGED), LATER)
    assert set(_names(events)) == {("MODIFIED", PODS, "a"), ("ADDED", PODS, "d"), ("DELETED", PODS, "c"),
                                   ("DELETED", NAMESPACES, "apps")}
    a = store.get(PODS, "default", "a")
    assert a["metadata"]["labels"]["version"] == "v2"
    assert a["metadata"]["creationTimestamp"] == NOW  # the same pod, changed


def test_list_and_get_with_selectors_and_namespace() -> None:
    store = _store()
    on_n1, _ = store.list_objects(PODS, fields=parse_field_selector("spec.nodeName=n1", POD_FIELDS))
    assert {p["metadata"]["name"] for p in on_n1} == {"a", "c"}
    in_default, _ = store.list_objects(PODS, "default", labels=parse_label_selector("app in (a,b)"))
    assert {p["metadata"]["name"] for p in in_default} == {"a", "b"}
    with pytest.raises(ApiError) as missing:
        store.get(PODS, "apps", "a")
    assert missing.value.status()["message"] == 'pods "a" not found'


def test_watch_replays_after_a_version_and_expires_what_the_log_no_longer_holds() -> None:
    store = _store(history=4)
    start = store.resource_version
    store.apply_registry(parse_registry(CHANGED), LATER)
    replay = store.watch_start(PODS, str(start))
    assert {n for _, _, n in _names(replay)} == {"a", "c", "d"}
    assert all(e.resource_version > start for e in replay)
    assert store.watch_start(PODS, str(store.resource_version)) == []
    with pytest.raises(ApiError) as expired:
        store.watch_start(PODS, "1")
    status = expired.value.status()
    assert (expired.value.code, status["reason"]) == (410, "Expired")
    assert status["message"].startswith("too old resource version: 1 (")
    synthetic = store.watch_start(PODS, "")
    assert {(t, n) for t, _, n in _names(synthetic)} == {("ADDED", "a"), ("ADDED", "b"), ("ADDED", "d")}
    with pytest.raises(ApiError) as bad:
        store.watch_start(PODS, "abc")
    assert bad.value.code == 400


def test_listeners_see_each_change_once() -> None:
    store = _store()
    seen: list[WatchEvent] = []
    unsubscribe = store.subscribe(seen.append)
    store.patch_pod("default", "a", MERGE_PATCH, {"metadata": {"labels": {"x": "1"}}})
    unsubscribe()
    store.patch_pod("default", "a", MERGE_PATCH, {"metadata": {"labels": {"x": "2"}}})
    assert _names(seen) == [("MODIFIED", PODS, "a")]


def test_filtered_watch_turns_changes_across_the_selector_into_added_and_deleted() -> None:
    store = _store()
    seen: list[WatchEvent] = []
    store.subscribe(seen.append)
    labels = parse_label_selector("repair=yes")
    store.patch_pod("default", "a", MERGE_PATCH, {"metadata": {"labels": {"repair": "yes"}}})
    store.patch_pod("default", "a", MERGE_PATCH, {"metadata": {"labels": {"other": "1"}}})
    store.patch_pod("default", "a", MERGE_PATCH, {"metadata": {"labels": {"repair": None}}})
    store.patch_pod("default", "b", MERGE_PATCH, {"metadata": {"labels": {"other": "1"}}})
    filtered = [filter_event(e, labels, None) for e in seen]
    assert [f.type if f else None for f in filtered] == ["ADDED", "MODIFIED", "DELETED", None]
    assert filter_event(seen[0], None, None, namespace="apps") is None


def test_status_patch_survives_a_reload_and_label_patches_are_kept() -> None:
    store = _store()
    reported = {"status": {"phase": "Pending", "initContainerStatuses": [
        {"name": "istio-validation", "ready": False, "restartCount": 1, "image": "x", "imageID": "",
         "state": {"waiting": {"reason": "CrashLoopBackOff"}},
         "lastState": {"terminated": {"exitCode": 126, "reason": "Error"}}}]}}
    before = store.get(PODS, "default", "a")["metadata"]["resourceVersion"]
    patched = store.patch_pod("default", "a", STRATEGIC_MERGE_PATCH, reported, "status")
    assert int(patched["metadata"]["resourceVersion"]) > int(before)
    assert patched["status"]["initContainerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 126
    assert patched["status"]["podIP"] == "10.0.0.1"  # strategic merge: the rest of status stays
    store.patch_pod("default", "a", MERGE_PATCH, {"metadata": {"labels": {"cni.istio.io/uninitialized": "true"}}},
                    "status")
    store.apply_registry(parse_registry(CHANGED), LATER)
    a = store.get(PODS, "default", "a")
    assert a["status"]["phase"] == "Pending"
    assert a["metadata"]["labels"]["cni.istio.io/uninitialized"] == "true"
    assert a["metadata"]["labels"]["version"] == "v2"


def test_patch_rules_main_resource_and_status_subresource() -> None:
    store = _store()
    ignored = store.patch_pod("default", "a", MERGE_PATCH, {"status": {"phase": "Failed"}})
    assert ignored["status"]["phase"] == "Running"  # status changes only through pods/status
    unchanged_rv = ignored["metadata"]["resourceVersion"]
    assert store.patch_pod("default", "a", MERGE_PATCH, {"metadata": {"labels": {"app": "a"}}})[
        "metadata"]["resourceVersion"] == unchanged_rv  # a no-op patch is not a change
    image = store.patch_pod("default", "a", JSON_PATCH, [
        {"op": "replace", "path": "/spec/containers/0/image", "value": "app:2"}])
    assert image["spec"]["containers"][0]["image"] == "app:2"
    with pytest.raises(ApiError) as forbidden_spec:
        store.patch_pod("default", "a", MERGE_PATCH, {"spec": {"nodeName": "elsewhere"}})
    assert forbidden_spec.value.code == 422
    spec_kept = store.patch_pod("default", "a", MERGE_PATCH, {"spec": {"nodeName": "x"},
                                                              "status": {"phase": "Succeeded"}}, "status")
    assert (spec_kept["spec"]["nodeName"], spec_kept["status"]["phase"]) == ("n1", "Succeeded")


def _code(call: Any) -> tuple[int, str]:
    with pytest.raises(ApiError) as err:
        call()
    return err.value.code, err.value.reason


def test_patch_and_delete_conflicts_and_errors() -> None:
    store = _store()
    a = store.get(PODS, "default", "a")
    assert _code(lambda: store.patch_pod("default", "a", MERGE_PATCH, {"metadata": {"resourceVersion": "1"}})) \
        == (409, "Conflict")
    ok = store.patch_pod("default", "a", MERGE_PATCH, {"metadata": {"resourceVersion": a["metadata"]
                                                                    ["resourceVersion"], "labels": {"k": "v"}}})
    assert ok["metadata"]["labels"]["k"] == "v"
    assert _code(lambda: store.patch_pod("default", "nope", MERGE_PATCH, {})) == (404, "NotFound")
    assert _code(lambda: store.patch_pod("default", "a", JSON_PATCH, [{"op": "test", "path": "/kind",
                                                                       "value": "Service"}])) == (422, "Invalid")
    assert _code(lambda: store.patch_pod("default", "a", "application/apply-patch+yaml", {}))[0] == 415
    assert _code(lambda: store.patch_pod("default", "a", MERGE_PATCH, {"metadata": {"name": "other"}}))[0] == 422
    assert _code(lambda: store.delete_pod("default", "a", uid="wrong")) == (409, "Conflict")
    assert _code(lambda: store.delete_pod("default", "a", resource_version="1")) == (409, "Conflict")


def test_delete_is_seen_and_the_pod_stays_deleted_until_its_entry_changes() -> None:
    store = _store()
    seen: list[WatchEvent] = []
    store.subscribe(seen.append)
    a = store.get(PODS, "default", "a")
    deleted = store.delete_pod("default", "a", uid=a["metadata"]["uid"],
                               resource_version=a["metadata"]["resourceVersion"])
    assert _names(seen) == [("DELETED", PODS, "a")]
    assert int(deleted["metadata"]["resourceVersion"]) == store.resource_version
    assert store.apply_registry(parse_registry(MESH), LATER) == []  # same entry: stays deleted
    events = store.apply_registry(parse_registry(CHANGED), LATER)  # a's entry changed: a new pod
    assert ("ADDED", PODS, "a") in _names(events)
    again = store.get(PODS, "default", "a")
    assert again["metadata"]["uid"] != a["metadata"]["uid"]
    assert again["metadata"]["creationTimestamp"] == LATER


def test_bookmark_object() -> None:
    assert bookmark(PODS, 42) == {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "42"}}


def test_history_must_hold_something() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        KubeStore("n", history=0)


def test_versions_of_an_earlier_run_are_expired() -> None:
    earlier = _store()
    old_version = earlier.resource_version
    restarted = KubeStore("default-node", first_version=1_000_000)
    restarted.apply_registry(parse_registry(MESH), NOW)
    assert restarted.list_objects(PODS)[1] > 1_000_000
    with pytest.raises(ApiError) as expired:
        restarted.watch_start(PODS, str(old_version))
    assert expired.value.code == 410
    assert restarted.watch_start(PODS, "1000000")  # this run's own start replays
    with pytest.raises(ValueError, match="start at 1"):
        KubeStore("n", first_version=0)
