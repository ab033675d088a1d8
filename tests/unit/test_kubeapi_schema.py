"""The Pod's fields as the apiserver's strict decoding knows them: unknown fields (top level, metadata, deep in a
container) are found and dropped, values of the wrong type reported with their path, and the field table is in
sync with the official `kubernetes` client's models (tests/component/test_kubeapi_schema_sync.py)."""

from __future__ import annotations

import copy

import pytest
from test_kubeapi_pods import _pods  # the injector-shaped pods the API serves

from istiod_local.controlplane.kubeapi import schema


def test_rendered_pods_hold_only_pod_fields_and_come_back_as_the_same_object() -> None:
    for pod in _pods().values():
        checked = schema.check(pod)
        assert checked.unknown == () and checked.mismatches == () and checked.object is pod


def test_unknown_fields_anywhere_are_dropped_and_named_as_the_apiserver_names_them() -> None:
    pod = copy.deepcopy(_pods()["echo-1"])
    original = copy.deepcopy(pod)
    pod["foo"] = 1
    pod["metadata"]["bar"] = {"x": 1}
    pod["spec"]["containers"][1]["sideways"] = True
    pod["status"]["x"] = "y"
    checked = schema.check(pod)
    assert checked.unknown == ("metadata.bar", "spec.containers[1].sideways", "status.x", "foo")
    assert checked.object == original and checked.mismatches == ()
    assert pod["foo"] == 1, "the input is left as it was"


@pytest.mark.parametrize(("path", "value", "expected"), [
    (("status", "phase"), {"a": 1}, "status.phase: Invalid value: object: must be a string"),
    (("status", "phase"), float("nan"), "status.phase: Invalid value: NaN: must be a finite number or a string"),
    (("spec", "containers"), {"name": "x"}, "spec.containers: Invalid value: object: must be an array"),
    (("spec", "terminationGracePeriodSeconds"), 1.5, "spec.terminationGracePeriodSeconds: Invalid value: 1.5: must "
                                                     "be an integer"),
    (("spec", "hostNetwork"), "true", "spec.hostNetwork: Invalid value: string: must be a boolean"),
    (("metadata", "creationTimestamp"), "yesterday", 'metadata.creationTimestamp: Invalid value: "yesterday": must '
                                                     "be an RFC 3339 time"),
])
def test_values_of_the_wrong_type_are_reported_with_their_field(path: tuple[str, str], value: object,
                                                                  expected: str) -> None:
    pod = copy.deepcopy(_pods()["echo-1"])
    pod[path[0]][path[1]] = value
    assert [str(m) for m in schema.check(pod).mismatches] == [expected]


def test_quantities_may_be_numbers_and_free_form_values_are_not_looked_into() -> None:
    pod = copy.deepcopy(_pods()["echo-1"])
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": 1, "memory": "1Gi"}}
    pod["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:anything": {"deep": [1]}}}]
    checked = schema.check(pod)
    assert checked.unknown == () and checked.mismatches == ()
