"""In-place repair on the local node (root): a pod created while install-cni is down starts without capture
(its `istio-validation` exits 126 and crash-loops), and once install-cni is back its repair controller finds
the pod's network namespace through /proc by the pod's IP, programs the capture there as the plugin would
have, counts `istio_cni_repair_pods_repaired_total{type="repair",result="success"}`, and the pod's next
validation (the kubelet's restart, `LocalNode.retry_init`) passes, its containers then starting.

The node runs install-cni with the istio-cni chart's repair defaults (repair in place; label and delete off)
and its own pod CIDR, so no other local node on this machine holds the pods' addresses.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from launchers import RegistryFile, local_node
from needs import need, need_root, need_tool
from prometheus_client.parser import text_string_to_metric_families
from support import poll

from istio_agent.kube import client as kube
from istiod_local.node.cni_node import connect_in_netns
from istiod_local.node.cni_plan import INSTALL_CNI_MONITORING_PORT
from istiod_local.node.local_node import LocalNode, PodInitError
from istiod_local.node.plan import PodSpec, registry_workloads

CIDR = "10.251.27.0/24"
METRIC = "istio_cni_repair_pods_repaired_total"
REPAIR_WITHIN = 10.0  # seconds from install-cni's /readyz (the bound)


@pytest.fixture(scope="module")
def node() -> Iterator[LocalNode]:
    need_root()
    for tool in ("ip", "setpriv", "iptables-save", "sleep"):
        need_tool(tool)
    for plugin in ("bridge", "host-local", "loopback"):
        need(Path(f"/usr/lib/cni/{plugin}").is_file(), f"needs containernetworking-plugins' {plugin}")
    with local_node("iarepair-", ready_timeout=30, capture="cni", cni_repair="repair", pod_cidr=CIDR) as local:
        plans = local.plan_pods([PodSpec("late-1", agent=False), PodSpec("first-1", agent=False),
                                 PodSpec("sys-1", namespace="kube-system", agent=False)])
        RegistryFile(local.registry, yaml.safe_dump({"workloads": registry_workloads(plans)}))
        local.start_istiod()
        yield local


def _rules(netns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", netns, "iptables-save", "-t", "nat"], capture_output=True,
                          text=True, check=True).stdout


def _repaired(node: LocalNode) -> dict[str, float]:
    """install-cni's `istio_cni_repair_pods_repaired_total` by result, for type="repair" (Prometheus' parser)."""
    target = kube.KubeConfig("http", node.plan.gateway, INSTALL_CNI_MONITORING_PORT)
    status, body = kube.request(target, "GET", "/metrics", timeout=5.0, user_agent="test", connect=lambda h, p, t:
                                connect_in_netns(node.plan.netns_path(), h, p, t))
    assert status == 200
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == METRIC and sample.labels.get("type") == "repair":
                counts[sample.labels["result"]] = sample.value
    return counts


def _api_pod(node: LocalNode, namespace: str, name: str) -> dict[str, Any]:
    assert node.cni is not None and node.cni.api is not None
    found = node.cni.api.get_pod(namespace, name)
    assert found is not None
    return found


def test_a_pod_created_while_install_cni_is_down_is_repaired_in_place(node: LocalNode) -> None:
    first = node.add_pod(node.planned[1])  # with install-cni up: captured at ADD, validation passes at once
    assert first.validation == [0] and "ISTIO_OUTPUT" in _rules(first.netns)
    assert node.stop_cni_agent() == 0  # its cleanup took the istio-cni entry out of the conflist
    with pytest.raises(PodInitError) as caught:
        node.add_pod(node.planned[0])
    late = caught.value.pod
    assert caught.value.exit_codes == [126, 126] and "ISTIO" not in _rules(late.netns) and late.app is None
    status = _api_pod(node, "default", "late-1")["status"]["initContainerStatuses"][0]
    assert status["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert status["lastState"]["terminated"]["exitCode"] == 126

    node.start_cni_agent()  # returns once /readyz answers 200
    poll(lambda: "ISTIO_OUTPUT" in _rules(late.netns), "install-cni to capture the pod in place", REPAIR_WITHIN)
    counts = poll(lambda: _repaired(node).get("success") == 1 and _repaired(node), "the repair to be counted", 10)
    assert counts.get("fail", 0) == 0
    # The rules are the plugin's for this pod: those the pod created with install-cni up got.
    assert _rules(late.netns).count("-A ISTIO_") == _rules(first.netns).count("-A ISTIO_")

    node.retry_init(late)  # the kubelet's restart after the back-off: now it passes, and the pod starts
    assert late.validation == [126, 126, 0]
    status = _api_pod(node, "default", "late-1")["status"]
    validation = status["initContainerStatuses"][0]
    assert validation["state"]["terminated"]["exitCode"] == 0 and status["phase"] == "Running"
    assert validation["lastState"]["terminated"]["exitCode"] == 126 and validation["restartCount"] == 2
    # Repaired once per pod: its later versions (the status reports above) are not programmed or counted again.
    assert _repaired(node) == counts


def test_a_pod_the_plugin_leaves_alone_is_not_repaired(node: LocalNode) -> None:
    # kube-system is excluded (the chart's default): the plugin gave the pod no capture on purpose, so its
    # validation fails, and in-place repair leaves it as the plugin did, counting a skip.
    node.start_cni_agent()  # running already, unless the test before failed halfway
    with pytest.raises(PodInitError) as caught:
        node.add_pod(node.planned[2])
    pod = caught.value.pod
    poll(lambda: _repaired(node).get("skip") == 1, "the repair to skip the excluded pod", 20)
    assert "ISTIO" not in _rules(pod.netns)
    with pytest.raises(PodInitError):
        node.retry_init(pod)
