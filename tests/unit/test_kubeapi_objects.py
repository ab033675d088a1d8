"""Stored objects of istiod-local's Kubernetes API (pure): create/update/patch rules, the store's generic writes
and their events, the objects rendered from the registry, TokenReview answers."""

from __future__ import annotations

from typing import Any

import pytest

from istio_agent.pki.keys import generate_key
from istiod_local.controlplane.kubeapi import objects, resources, tokenreview
from istiod_local.controlplane.kubeapi import store as kstore
from istiod_local.controlplane.kubeapi.errors import ApiError
from istiod_local.controlplane.kubeapi.patch import JSON_PATCH, MERGE_PATCH
from istiod_local.controlplane.kubeapi.resources import BY_KEY, CONFIGMAPS, ENDPOINTSLICES, SERVICES
from istiod_local.controlplane.kubeapi.store import KubeStore
from istiod_local.controlplane.tokens import TokenIdentity, TokenVerifier, issue_token
from istiod_local.controlplane.xds.registry import parse_registry

NOW = "2026-12-01T12:00:00Z"
CM = BY_KEY[CONFIGMAPS]
LEASES = "leases.coordination.k8s.io"
MESH = """
services:
- {name: echo, namespace: default, selector: {app: echo}, clusterIP: 10.96.0.20,
   ports: [{name: http, port: 80, targetPort: 8080, protocol: HTTP}]}
workloads:
- {name: echo-1, labels: {app: echo}, ip: 10.0.0.1, nodeName: n1}
- {name: other, labels: {app: other}, ip: 10.0.0.2}
"""


def _refused(call: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call()
    return caught.value


def test_a_create_is_named_placed_and_stripped_of_server_fields() -> None:
    obj, size = objects.new_object(CM, "default", {"metadata": {"generateName": "cm-", "uid": "u",
                                                               "resourceVersion": "9", "namespace": "default"},
                                                  "data": {"a": "b"}})
    assert obj["kind"] == "ConfigMap" and obj["apiVersion"] == "v1"
    assert obj["metadata"]["name"].startswith("cm-") and len(obj["metadata"]["name"]) == 8
    assert obj["metadata"]["namespace"] == "default" and "uid" not in obj["metadata"]
    assert "resourceVersion" not in obj["metadata"] and size > 0


@pytest.mark.parametrize(("body", "code"), [
    ({"metadata": {}}, 422),  # no name
    ({"metadata": {"name": "Bad_Name"}}, 422),
    ({"metadata": {"name": "x", "namespace": "other"}}, 400),
    ({"kind": "Secret", "metadata": {"name": "x"}}, 400),
    ({"apiVersion": "v2", "metadata": {"name": "x"}}, 400),
    ({"metadata": {"name": "x", "labels": {"a": 1}}}, 400),
    ({"metadata": {"name": "x", "annotations": {"bad key!": "v"}}}, 422),
    ({"metadata": {"name": "x"}, "data": {"k": "x" * resources.OBJECT_MAX_BYTES}}, 413),
    ([], 400),
])
def test_a_bad_create_is_refused_as_the_apiserver_refuses_it(body: Any, code: int) -> None:
    assert _refused(lambda: objects.new_object(CM, "default", body)).code == code


def test_a_cluster_scoped_create_has_no_namespace() -> None:
    obj, _ = objects.new_object(BY_KEY["customresourcedefinitions.apiextensions.k8s.io"], "",
                                {"metadata": {"name": "x.example.com", "namespace": "ignored"}})
    assert "namespace" not in obj["metadata"]


def _stored(store: KubeStore, name: str = "cm", **data: str) -> dict[str, Any]:
    obj, size = objects.new_object(CM, "default", {"metadata": {"name": name}, "data": dict(data)})
    return store.create(CONFIGMAPS, obj, NOW, size)


def test_update_keeps_what_the_server_owns_and_checks_the_resource_version() -> None:
    store = KubeStore("n")
    old = _stored(store, a="1")
    new, _ = objects.updated_object(CM, old, {"metadata": {"name": "cm", "uid": old["metadata"]["uid"],
                                                           "resourceVersion": old["metadata"]["resourceVersion"]},
                                              "data": {"a": "2"}}, "default", "cm")
    assert new["metadata"]["creationTimestamp"] == NOW and "resourceVersion" not in new["metadata"]
    committed = store.commit_object(CONFIGMAPS, old, new)
    assert committed["data"] == {"a": "2"} and committed["metadata"]["uid"] == old["metadata"]["uid"]
    stale = _refused(lambda: objects.updated_object(CM, committed, {"metadata": old["metadata"]}, "default", "cm"))
    assert stale.code == 409 and "has been modified" in stale.message
    assert _refused(lambda: objects.updated_object(CM, committed, {"metadata": {"name": "other"}}, "default",
                                                   "cm")).code == 400
    with pytest.raises(kstore.StaleObject):  # committed from a version that is no longer the stored one
        store.commit_object(CONFIGMAPS, old, new)


def test_patches_apply_to_the_stored_object() -> None:
    store = KubeStore("n")
    old = _stored(store, a="1")
    merged, _ = objects.patched_object(CM, old, MERGE_PATCH, {"data": {"b": "2"}}, "default", "cm")
    assert merged["data"] == {"a": "1", "b": "2"}
    patched, _ = objects.patched_object(CM, old, JSON_PATCH, [{"op": "remove", "path": "/data/a"}], "default", "cm")
    assert patched["data"] == {}
    assert _refused(lambda: objects.patched_object(CM, old, "application/apply-patch+yaml", {}, "default",
                                                   "cm")).code == 415
    assert _refused(lambda: objects.patched_object(CM, old, JSON_PATCH, [{"op": "test", "path": "/data/a",
                                                                          "value": "9"}], "default", "cm")).code == 400


def test_an_unchanged_write_keeps_the_version_and_emits_nothing() -> None:
    store = KubeStore("n")
    old = _stored(store, a="1")
    events: list[Any] = []
    store.subscribe(events.append)
    same, _ = objects.updated_object(CM, old, {"metadata": {"name": "cm"}, "data": {"a": "1"}}, "default", "cm")
    assert store.commit_object(CONFIGMAPS, old, same) is old and events == []


def test_creates_and_deletes_are_events_with_preconditions_and_a_count_limit(monkeypatch: pytest.MonkeyPatch
                                                                             ) -> None:
    store = KubeStore("n")
    events: list[Any] = []
    store.subscribe(events.append)
    created = _stored(store)
    assert _refused(lambda: _stored(store)).code == 409
    assert _refused(lambda: store.delete(CONFIGMAPS, "default", "cm", uid="nope")).code == 409
    store.delete(CONFIGMAPS, "default", "cm", uid=created["metadata"]["uid"])
    assert [e.type for e in events] == ["ADDED", "DELETED"]
    assert _refused(lambda: store.delete(CONFIGMAPS, "default", "cm")).code == 404
    assert _stored(store)["metadata"]["uid"] != created["metadata"]["uid"]  # a new incarnation
    monkeypatch.setattr(kstore, "MAX_OBJECTS_PER_TYPE", 2)
    _stored(store, "cm2")
    assert _refused(lambda: _stored(store, "cm3")).code == 403


def test_the_registry_renders_services_slices_and_nodes_and_leaves_client_objects_alone() -> None:
    store = KubeStore("default-node")
    store.apply_registry(parse_registry(MESH), NOW)
    lease, _ = objects.new_object(BY_KEY[LEASES], "istio-system", {"metadata": {"name": "l"}})
    store.create(LEASES, lease, NOW)
    service = store.get(SERVICES, "default", "echo")
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP",
                                         "appProtocol": "http"}]
    slice_ = store.get(ENDPOINTSLICES, "default", "echo-istiod-local")
    assert [e["targetRef"]["name"] for e in slice_["endpoints"]] == ["echo-1"]
    assert slice_["metadata"]["ownerReferences"][0]["uid"] == service["metadata"]["uid"]
    assert {n["metadata"]["name"] for n in store.list_objects("nodes")[0]} == {"default-node", "n1"}
    store.apply_registry(parse_registry(MESH.replace("app: other", "app: echo")), NOW)  # `other` joins echo
    slice_ = store.get(ENDPOINTSLICES, "default", "echo-istiod-local")
    assert [e["targetRef"]["name"] for e in slice_["endpoints"]] == ["echo-1", "other"]
    store.apply_registry(parse_registry("workloads: []"), NOW)
    assert store.list_objects(SERVICES)[0] == [] and store.list_objects(ENDPOINTSLICES)[0] == []
    assert store.get(LEASES, "istio-system", "l")["metadata"]["name"] == "l"  # a client's: kept


def test_an_endpoint_is_ready_as_its_pod() -> None:
    store = KubeStore("n")
    store.apply_registry(parse_registry(MESH), NOW)
    store.patch_pod("default", "echo-1", MERGE_PATCH, {"status": {"conditions": [{"type": "Ready",
                                                                                   "status": "False"}]}}, "status")
    endpoint = store.get(ENDPOINTSLICES, "default", "echo-istiod-local")["endpoints"][0]
    assert endpoint["conditions"] == {"ready": False, "serving": False, "terminating": False}
    store.delete_pod("default", "echo-1")
    assert store.get(ENDPOINTSLICES, "default", "echo-istiod-local")["endpoints"] == []


def test_bookmarks_name_the_types_kind_and_group() -> None:
    assert kstore.bookmark(LEASES, 5) == {"kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
                                          "metadata": {"resourceVersion": "5"}}


KEY = generate_key("ECDSA")


def _verify(token: str, audience: str) -> Any:
    return TokenVerifier(KEY.public_key(), audience=audience).verify(token, 1000.0)


def test_token_review_answers_with_the_identity_and_the_pod() -> None:
    token = issue_token(KEY, TokenIdentity("default", "echo", "echo-1", "pod-uid"), 900.0, 3600)
    answer = tokenreview.review({"spec": {"token": token, "audiences": ["other", "istio-ca"]}}, _verify, "api")
    status = answer["status"]
    assert status["authenticated"] is True and status["audiences"] == ["istio-ca"]
    assert status["user"]["username"] == "system:serviceaccount:default:echo"
    assert status["user"]["extra"] == {"authentication.kubernetes.io/pod-name": ["echo-1"],
                                       "authentication.kubernetes.io/pod-uid": ["pod-uid"]}
    assert "system:serviceaccounts:default" in status["user"]["groups"]


def test_token_review_refusals_are_answers_not_errors() -> None:
    token = issue_token(KEY, TokenIdentity("default", "echo"), 900.0, 3600)
    wrong = tokenreview.review({"spec": {"token": token, "audiences": ["other"]}}, _verify, "api")["status"]
    assert wrong["authenticated"] is False and "audience" in wrong["error"]
    other_key = issue_token(generate_key("ECDSA"), TokenIdentity("default", "echo"), 900.0, 3600)
    assert tokenreview.review({"spec": {"token": other_key}}, _verify, "istio-ca")["status"]["authenticated"] is False
    assert _refused(lambda: tokenreview.review({"spec": {}}, _verify, "api")).code == 422
    assert _refused(lambda: tokenreview.review({"spec": {"token": "t", "audiences": "x"}}, _verify, "api")).code == 400


def test_a_label_patch_moves_a_pod_into_a_services_endpoints_and_touches_no_other_slice() -> None:
    store = KubeStore("n")
    store.apply_registry(parse_registry(MESH), NOW)
    events: list[Any] = []
    store.subscribe(events.append)
    store.patch_pod("default", "other", MERGE_PATCH, {"metadata": {"labels": {"app": "echo"}}})
    slice_ = store.get(ENDPOINTSLICES, "default", "echo-istiod-local")
    assert [e["targetRef"]["name"] for e in slice_["endpoints"]] == ["echo-1", "other"]
    assert [(e.type, e.resource) for e in events] == [("MODIFIED", "pods"), ("MODIFIED", ENDPOINTSLICES)]
    events.clear()
    store.patch_pod("default", "echo-1", MERGE_PATCH, {"metadata": {"annotations": {"a": "b"}}})
    assert [e.resource for e in events] == ["pods"]  # the endpoints did not change: no slice event
