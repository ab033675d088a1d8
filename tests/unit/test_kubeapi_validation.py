"""Label and annotation rules on PATCH of pods and pods/status: the apiserver's 422 and its wording."""

from __future__ import annotations

from typing import Any

import pytest

from istiod_local.controlplane.kubeapi import validation
from istiod_local.controlplane.kubeapi.errors import ApiError
from istiod_local.controlplane.kubeapi.patch import JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH
from istiod_local.controlplane.kubeapi.store import PODS, KubeStore
from istiod_local.controlplane.xds.registry import parse_registry

NAME_PART = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
             "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
             "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
VALUE = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
         "start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used "
         "for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")
PREFIX = ("prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
          "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
          "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")


def _store() -> KubeStore:
    store = KubeStore("n1")
    store.apply_registry(parse_registry("workloads:\n- {name: x, labels: {app: x}, ip: 10.0.0.1, nodeName: n1}\n"),
                         "2026-12-01T12:00:00Z")
    return store


def _refused(store: KubeStore, body: Any, subresource: str = "", content_type: str = MERGE_PATCH) -> ApiError:
    before = store.get(PODS, "default", "x")
    with pytest.raises(ApiError) as err:
        store.patch_pod("default", "x", content_type, body, subresource)
    assert store.get(PODS, "default", "x") is before  # nothing stored
    return err.value


@pytest.mark.parametrize("subresource", ["", "status"])
def test_a_bad_label_key_is_422_in_the_apiservers_words(subresource: str) -> None:
    err = _refused(_store(), {"metadata": {"labels": {"bad key!": "v"}}}, subresource)
    status = err.status()
    assert (err.code, status["reason"]) == (422, "Invalid")
    assert status["message"] == f'Pod "x" is invalid: metadata.labels: Invalid value: "bad key!": {NAME_PART}'
    assert status["details"] == {"name": "x", "kind": "Pod", "causes": [
        {"reason": "FieldValueInvalid", "message": f'Invalid value: "bad key!": {NAME_PART}',
         "field": "metadata.labels"}]}


def test_label_values_prefixes_and_lengths() -> None:
    store = _store()
    value = _refused(store, {"metadata": {"labels": {"app": "-x"}}})
    assert value.message == f'Pod "x" is invalid: metadata.labels: Invalid value: "-x": {VALUE}'
    long_value = _refused(store, {"metadata": {"labels": {"app": "v" * 64}}})
    assert long_value.message == (f'Pod "x" is invalid: metadata.labels: Invalid value: "{"v" * 64}": must be no '
                                  "more than 63 characters")
    prefix = _refused(store, {"metadata": {"labels": {"Example.com/k": "v"}}}, "", STRATEGIC_MERGE_PATCH)
    assert prefix.message == f'Pod "x" is invalid: metadata.labels: Invalid value: "Example.com/k": {PREFIX}'
    long_prefix = "a" * 254
    assert validation.qualified_name(f"{long_prefix}/k")[0] == "prefix part must be no more than 253 characters"
    assert validation.qualified_name("/k") == ["prefix part must be non-empty"]
    assert validation.qualified_name("a/b/c")[0].startswith("a qualified name must consist of")
    assert validation.qualified_name("k" * 64) == ["name part must be no more than 63 characters"]
    two = _refused(store, [{"op": "add", "path": "/metadata/labels/bad!", "value": "-"}], "", JSON_PATCH)
    assert two.message == (f'Pod "x" is invalid: [metadata.labels: Invalid value: "bad!": {NAME_PART}, '
                           f'metadata.labels: Invalid value: "-": {VALUE}]')
    assert len(two.status()["details"]["causes"]) == 2


def test_annotation_keys_case_insensitive_and_total_size() -> None:
    store = _store()
    ok = store.patch_pod("default", "x", MERGE_PATCH, {"metadata": {"annotations": {
        "Sidecar.Istio.IO/Status": "{\"any\": \"value at all\"}", "empty": ""}}})
    assert ok["metadata"]["annotations"]["Sidecar.Istio.IO/Status"].startswith("{")
    key = _refused(store, {"metadata": {"annotations": {"not ok": "v"}}}, "status")
    assert key.message == f'Pod "x" is invalid: metadata.annotations: Invalid value: "not ok": {NAME_PART}'
    big = _refused(store, {"metadata": {"annotations": {"big": "x" * (256 * 1024)}}})
    assert big.message == 'Pod "x" is invalid: metadata.annotations: Too long: must have at most 262144 bytes'
    assert big.status()["details"]["causes"][0]["reason"] == "FieldValueTooLong"
    fits = store.patch_pod("default", "x", MERGE_PATCH, {"metadata": {"annotations": {
        "big": "x" * (256 * 1024 - len("big") - sum(len(k) + len(v) for k, v in
                                                     ok["metadata"]["annotations"].items()))}}})
    assert "big" in fits["metadata"]["annotations"]


def test_good_keys_pass() -> None:
    for key in ("app", "cni.istio.io/uninitialized", "app.kubernetes.io/name", "A_b.c-9", "x"):
        assert validation.qualified_name(key) == []
    assert validation.label_value("") == [] and validation.label_value("v1.2_3-x") == []
