"""The repair controller's rules (upstream's `matchesFilter` and actions), on Pod JSON as the API serves it."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest

from istio_agent.cni.repair.options import RepairOptions
from istio_agent.cni.repair.rules import (
    RepairOptionsError,
    check_options,
    chosen_action,
    delete_options,
    diagnose,
    event,
    field_selector,
    has_label,
    label_patch,
    label_selector_error,
    pod_key,
)

OPTIONS = RepairOptions(node_name="n1", label_pods=True)


def pod(*, node: str = "n1", annotated: bool = True, state: dict[str, Any] | None = None,
        last: dict[str, Any] | None = None, container: str = "istio-validation",
        labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A sidecar pod whose validation container is in `state`, having last terminated as `last`."""
    status: dict[str, Any] = {"name": container, "ready": False, "restartCount": 1, "image": "proxyv2",
                              "state": state or {"waiting": {"reason": "CrashLoopBackOff"}}}
    if last is not None:
        status["lastState"] = {"terminated": last}
    annotations = {"sidecar.istio.io/status": '{"initContainers":["istio-validation"]}'} if annotated else {}
    return {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": "p", "namespace": "default", "uid": "u-1", "resourceVersion": "7",
                     "annotations": annotations, "labels": labels or {"app": "echo"}},
        "spec": {"nodeName": node, "initContainers": [{"name": container}], "containers": [{"name": "istio-proxy"}]},
        "status": {"phase": "Pending", "initContainerStatuses": [status]},
    }


FAILED = {"exitCode": 126, "reason": "Error", "message": "iptables validation failed"}


def test_exit_code_in_the_last_termination_is_broken() -> None:
    verdict = diagnose(pod(last=FAILED), OPTIONS)
    assert verdict.broken
    assert "istio-validation" in verdict.reason and "126" in verdict.reason


def test_another_exit_code_is_not_broken() -> None:
    assert not diagnose(pod(last={**FAILED, "exitCode": 1}), OPTIONS).broken


def test_exit_code_zero_in_options_matches_any_code() -> None:
    assert diagnose(pod(last={**FAILED, "exitCode": 3}), replace(OPTIONS, init_container_exit_code=0)).broken


def test_termination_message_must_match_trimmed_when_configured() -> None:
    by_message = replace(OPTIONS, init_container_termination_message="  iptables validation failed\n")
    assert diagnose(pod(last={**FAILED, "message": "iptables validation failed  "}), by_message).broken
    assert not diagnose(pod(last={**FAILED, "message": "something else"}), by_message).broken
    assert not diagnose(pod(last={"exitCode": 126}), by_message).broken
    # Both filters hold together: the message alone is not enough.
    assert not diagnose(pod(last={**FAILED, "exitCode": 1}), by_message).broken


def test_a_pod_on_another_node_is_not_ours() -> None:
    verdict = diagnose(pod(node="n2", last=FAILED), OPTIONS)
    assert not verdict.broken
    assert "n2" in verdict.reason
    # With no node name, pods on every node are ours.
    assert diagnose(pod(node="n2", last=FAILED), replace(OPTIONS, node_name="")).broken


def test_without_the_sidecar_annotation_a_pod_is_ignored() -> None:
    verdict = diagnose(pod(annotated=False, last=FAILED), OPTIONS)
    assert not verdict.broken
    assert "sidecar.istio.io/status" in verdict.reason
    # An empty annotation setting considers every pod.
    assert diagnose(pod(annotated=False, last=FAILED), replace(OPTIONS, sidecar_annotation="")).broken


def test_an_init_container_still_running_without_a_failure_is_not_broken() -> None:
    assert not diagnose(pod(state={"running": {"startedAt": "2026-12-01T12:00:00Z"}}), OPTIONS).broken


def test_a_first_failure_without_last_state_is_not_acted_on_as_upstream() -> None:
    """Upstream looks at `lastState` only: the kubelet reports it once it restarts the container."""
    assert not diagnose(pod(state={"terminated": FAILED}), OPTIONS).broken


def test_running_again_after_a_failure_is_broken() -> None:
    assert diagnose(pod(state={"running": {}}, last=FAILED), OPTIONS).broken


def test_a_current_successful_termination_wins_over_a_failed_last_one() -> None:
    for success in ({"exitCode": 0, "reason": "Completed"}, {"exitCode": 0}, {"exitCode": 2, "reason": "Completed"}):
        assert not diagnose(pod(state={"terminated": success}, last=FAILED), OPTIONS).broken
    # A current failure does not hide the last one.
    assert diagnose(pod(state={"terminated": FAILED}, last=FAILED), OPTIONS).broken


def test_other_init_containers_are_ignored_unless_the_name_is_empty() -> None:
    other = pod(container="istio-init", last=FAILED)
    assert not diagnose(other, OPTIONS).broken
    assert diagnose(other, replace(OPTIONS, init_container_name="")).broken


def test_malformed_pods_are_not_broken() -> None:
    malformed: list[dict[str, Any]] = [{}, {"metadata": None, "status": []},
                                       {**pod(), "status": {"initContainerStatuses": [None, 3, {"lastState": "x"}]}}]
    for broken_json in malformed:
        assert not diagnose(broken_json, replace(OPTIONS, sidecar_annotation="", node_name="")).broken


def test_the_label_patch_is_upstreams_merge_patch() -> None:
    body = label_patch(replace(OPTIONS, label_key="cni.istio.io/uninitialized", label_value="true"))
    assert body == b'{"metadata":{"labels":{"cni.istio.io/uninitialized":"true"}}}'
    quoted = label_patch(replace(OPTIONS, label_key='a"b', label_value="x"))
    assert json.loads(quoted) == {"metadata": {"labels": {'a"b': "x"}}}


def test_delete_preconditions_name_the_judged_incarnation() -> None:
    assert delete_options(pod(last=FAILED)) == {"kind": "DeleteOptions", "apiVersion": "v1",
                                                "preconditions": {"uid": "u-1", "resourceVersion": "7"}}


def test_has_label_and_key() -> None:
    labelled = pod(labels={"cni.istio.io/uninitialized": "true"})
    assert has_label(labelled, "cni.istio.io/uninitialized")
    assert not has_label(pod(), "cni.istio.io/uninitialized")
    assert str(pod_key(labelled)) == "default/p" and pod_key(labelled).uid == "u-1"


def test_actions_in_upstreams_order() -> None:
    assert chosen_action(RepairOptions(repair_pods=True, delete_pods=True, label_pods=True)) == "repair"
    assert chosen_action(RepairOptions(delete_pods=True, label_pods=True)) == "delete"
    assert chosen_action(RepairOptions(label_pods=True)) == "label"
    assert chosen_action(RepairOptions()) is None


def test_field_selector_adds_the_node() -> None:
    assert field_selector(RepairOptions(node_name="n1")) == "spec.nodeName=n1"
    assert field_selector(RepairOptions(node_name="n1", field_selectors="status.phase!=Running")) \
        == "status.phase!=Running,spec.nodeName=n1"
    assert field_selector(RepairOptions()) == ""


@pytest.mark.parametrize("selector", ["", "app=echo", "app==echo,tier!=web", "app in (a, b),!legacy",
                                      "example.com/role notin (x)", "present", "gen>3", "version=",
                                      "app=echo, tier in (a,b)"])
def test_label_selectors_that_parse(selector: str) -> None:
    assert label_selector_error(selector) == ""


@pytest.mark.parametrize("selector", ["=echo", "app=echo=x", "app in a", "a b", "gen>x",
                                      "app=bad value", "-app=x", "app in (a b)"])
def test_label_selectors_that_do_not(selector: str) -> None:
    assert label_selector_error(selector) != ""


@pytest.mark.parametrize(("options", "flag"), [
    (RepairOptions(label_pods=True, label_key="bad key"), "--repair-broken-pod-label-key"),
    (RepairOptions(label_pods=True, label_key="Bad_Prefix/x"), "--repair-broken-pod-label-key"),
    (RepairOptions(label_pods=True, label_value="no spaces"), "--repair-broken-pod-label-value"),
    (RepairOptions(field_selectors="spec.nodeName"), "--repair-field-selectors"),
    (RepairOptions(label_selectors="app in x"), "--repair-label-selectors"),
    (RepairOptions(init_container_exit_code=256), "--repair-init-container-exit-code"),
    (RepairOptions(repair_pods=True, host_proc_dir=" "), "--repair-host-proc-dir"),
])
def test_bad_options_name_the_flag_and_value(options: RepairOptions, flag: str) -> None:
    with pytest.raises(RepairOptionsError, match=flag):
        check_options(options)


def test_good_options_pass() -> None:
    check_options(RepairOptions(label_pods=True, label_selectors="app=echo", field_selectors="status.phase=Pending"))
    check_options(RepairOptions())
    check_options(RepairOptions(repair_pods=True, host_proc_dir="/proc"))
    check_options(RepairOptions(label_pods=True, host_proc_dir=""))  # only in-place repair reads it


def test_diagnose_does_not_mutate_the_pod() -> None:
    original = pod(last=FAILED)
    kept = copy.deepcopy(original)
    diagnose(original, OPTIONS)
    assert original == kept


def test_the_event_names_the_pod_version_and_component() -> None:
    body = event(pod(last=FAILED), "LabelBrokenPod", "labelled", 1_764_590_400.5)
    assert body["involvedObject"] == {"kind": "Pod", "apiVersion": "v1", "namespace": "default", "name": "p",
                                      "uid": "u-1", "resourceVersion": "7"}
    assert body["reason"] == "LabelBrokenPod" and body["type"] == "Warning" and body["count"] == 1
    assert body["source"] == {"component": "cni-repair"}
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2025-12-01T12:00:00Z"
    assert body["metadata"]["namespace"] == "default" and body["metadata"]["name"].startswith("p.")
