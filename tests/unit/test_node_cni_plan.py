"""The local node's CNI side as data: primary network, pod invocations, install-cni's command line, the
capture flags both modes derive from a pod's annotations, the registry entries and the kubelet's status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from istiod_local.controlplane.xds.registry import parse_registry
from istiod_local.node.cni_plan import (
    CniPaths,
    container_id,
    host_veth,
    install_cni_argv,
    install_cni_environment,
    loopback_attachment,
    pick_network_file,
    pod_attachment,
    pod_status_patch,
    primary_conflist,
    repair_environment,
    result_address,
    sandbox_argv,
    validation_status,
)
from istiod_local.node.cni_runtime import parse_network
from istiod_local.node.plan import (
    PlanError,
    PodSpec,
    capture_args,
    plan_node,
    plan_pod,
    registry_workloads,
    validation_args,
)

NODE = plan_node(77, 1)
PATHS = CniPaths(Path("/run/istio-agent-node/77-1/cni"))


def test_the_primary_network_is_bridge_and_host_local_for_the_pod_cidr_kept_in_the_runtime_dir() -> None:
    network = parse_network(json.dumps(primary_conflist(NODE, PATHS.ipam_dir)), "primary")
    [bridge] = network.plugins
    assert bridge.type == "bridge" and bridge.config["bridge"] == NODE.bridge and bridge.config["isGateway"]
    assert bridge.capabilities == frozenset({"ips"})
    ipam = bridge.config["ipam"]
    assert ipam["type"] == "host-local" and ipam["dataDir"] == "/run/istio-agent-node/77-1/cni/ipam"
    assert ipam["ranges"] == [[{"subnet": "10.244.0.0/24", "gateway": "10.244.0.1"}]]
    assert network.cni_version == "1.0.0"


def test_a_pod_is_attached_with_the_kubelets_cni_args_and_its_planned_address() -> None:
    pod = plan_pod(NODE, PodSpec("echo-1", namespace="shop", ip="10.244.0.9"), [])
    sandbox = container_id(pod, 1)
    assert len(sandbox) == 64 and sandbox != container_id(pod, 2)
    eth0 = pod_attachment(pod, sandbox)
    assert (eth0.netns, eth0.ifname) == ("/var/run/netns/ia-77-1-echo-1", "eth0")
    assert eth0.args == (("IgnoreUnknown", "1"), ("K8S_POD_NAMESPACE", "shop"), ("K8S_POD_NAME", "echo-1"),
                         ("K8S_POD_INFRA_CONTAINER_ID", sandbox))
    assert eth0.capability_args == {"ips": ["10.244.0.9/24"]}
    lo = loopback_attachment(pod, sandbox)
    assert lo.ifname == "lo" and lo.args == eth0.args and not lo.capability_args


def test_the_runtime_picks_the_lexically_first_network_file() -> None:
    assert pick_network_file(["20-b.conflist", "10-a.conf", "05-x.txt", ".10-a.conflist.partial"]) == "10-a.conf"
    assert pick_network_file(["README"]) is None


def test_results_give_the_address_and_the_node_side_veth() -> None:
    result = {"interfaces": [{"name": "br0"}, {"name": "veth1a2b"}, {"name": "eth0", "sandbox": "/var/run/netns/p"}],
              "ips": [{"address": "fd00::5/64"}, {"address": "10.244.0.5/24", "interface": 2}]}
    assert result_address(result) == "10.244.0.5"
    assert host_veth(result, "br0") == "veth1a2b"
    assert (result_address({}), host_veth({}, "br0")) == ("", "")


def test_install_cni_runs_against_the_nodes_own_directories_and_api() -> None:
    argv = install_cni_argv("/venv/bin/install-cni", PATHS, "delete")
    flags = dict(arg.partition("=")[::2] for arg in argv[1:] if arg.startswith("--") and "=" in arg)
    values = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert values["--mounted-cni-net-dir"] == str(PATHS.net_dir) and values["--cni-bin-dir"] == str(PATHS.bin_dir)
    assert values["--cni-agent-run-dir"] == str(PATHS.run_dir)
    assert values["--service-account-dir"] == str(PATHS.service_account_dir)
    assert flags["--repair-enabled"] == "true" and flags["--repair-delete-pods"] == "true"
    assert flags["--repair-label-pods"] == "false"
    assert "--repair-label-pods" not in " ".join(install_cni_argv("i", PATHS, "off"))
    with pytest.raises(ValueError, match="'fix'"):
        install_cni_argv("i", PATHS, "fix")
    assert "--repair-host-proc-dir" not in argv
    # The chart's default: in place, label and delete off, the host's procfs being /proc here.
    repair = install_cni_argv("i", PATHS, "repair")
    assert {"--repair-enabled=true", "--repair-label-pods=false", "--repair-delete-pods=false"} <= set(repair)
    assert repair[repair.index("--repair-host-proc-dir") + 1] == "/proc"
    assert repair_environment("repair") == {"REPAIR_REPAIR_PODS": "true"}
    assert repair_environment("label") == {"REPAIR_REPAIR_PODS": "false"}
    env = install_cni_environment(NODE, {"PATH": "/bin", "KUBECONFIG": "/root/.kube/config"})
    assert env == {"PATH": "/bin", "HOME": "/tmp", "KUBERNETES_SERVICE_HOST": "10.244.0.1",
                   "KUBERNETES_SERVICE_PORT": "6443", "KUBERNETES_NODE_NAME": "ia-77-1-node"}


def test_annotations_shape_the_capture_in_both_modes_as_the_injector_writes_it() -> None:
    spec = PodSpec("echo-1", annotations={
        "sidecar.istio.io/interceptionMode": "TPROXY",
        "traffic.sidecar.istio.io/excludeOutboundIPRanges": "10.96.0.0/16",
        "traffic.sidecar.istio.io/excludeInboundPorts": "8081, 15020",
        "traffic.sidecar.istio.io/excludeOutboundPorts": "5432",
        "traffic.sidecar.istio.io/excludeInterfaces": "eth1"})
    pod = plan_pod(NODE, spec, [])
    args = capture_args(pod)
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert flags["-m"] == "TPROXY" and flags["-x"] == "10.96.0.0/16" and flags["-o"] == "5432"
    assert flags["-d"] == "15090,15021,15020,8081" and flags["-c"] == "eth1"
    assert validation_args(pod) == [*args[2:], "--run-validation", "--skip-rule-apply"]


def test_registry_entries_carry_what_the_kubernetes_api_renders_and_istiod_local_accepts_them() -> None:
    init_node = plan_node(77, 2, capture="init")
    sidecar = plan_pod(NODE, PodSpec("echo-1", dns_capture=True, annotations={"a": "b"},
                                     agent_env={"INVALID_DROP": "true"}), [])
    plain = plan_pod(NODE, PodSpec("plain-1", sidecar=False), [sidecar])
    grpc = plan_pod(NODE, PodSpec("grpc-1", proxyless=True, dns_capture=True), [sidecar, plain])
    old = plan_pod(init_node, PodSpec("old-1"), [])
    entries = registry_workloads([sidecar, plain, grpc, old])
    assert [(e["sidecar"], e["captureInit"], e["nodeName"]) for e in entries] == [
        ("envoy", "cni", "ia-77-1-node"), ("none", "cni", "ia-77-1-node"), ("proxyless", "cni", "ia-77-1-node"),
        ("envoy", "init", "ia-77-2-node")]
    assert entries[0]["annotations"] == {"a": "b"}
    assert entries[0]["pod"] == {"spec": {"containers": [{"name": "istio-proxy", "env": [
        {"name": "ISTIO_META_DNS_CAPTURE", "value": "true"}, {"name": "INVALID_DROP", "value": "true"}]}]}}
    assert "pod" not in entries[2]  # the grpc-agent template sets its own DNS capture (off)
    workloads = parse_registry(json.dumps({"workloads": entries})).workloads
    assert [(w.sidecar, w.capture_init, w.node_name) for w in workloads] == [
        (e["sidecar"], e["captureInit"], e["nodeName"]) for e in entries]
    with pytest.raises(PlanError, match="'sidecar'"):
        plan_node(1, capture="sidecar")


def test_a_pods_sandbox_process_holds_its_namespace() -> None:
    pod = plan_pod(NODE, PodSpec("a-1"), [])
    assert sandbox_argv(pod) == ["ip", "netns", "exec", pod.netns, "sleep", "infinity"]


def test_a_failed_validation_is_reported_as_a_kubelet_does_once_restarted() -> None:
    at = "2026-12-01T12:00:00Z"
    nothing = {"waiting": None, "running": None, "terminated": None}  # a patch clears what the state was
    passed = validation_status([0], at)
    assert passed["ready"] and passed["state"]["terminated"]["exitCode"] == 0 and passed["lastState"] == nothing
    first = validation_status([126], at)
    assert first["state"]["terminated"]["exitCode"] == 126 and first["state"]["running"] is None
    looping = validation_status([126, 126], at, "capture missing")
    assert looping["state"] == {**nothing, "waiting": {
        "reason": "CrashLoopBackOff", "message": "back-off restarting failed container istio-validation"}}
    assert looping["lastState"]["terminated"]["exitCode"] == 126 and looping["restartCount"] == 1
    assert looping["lastState"]["terminated"]["message"] == "capture missing"
    recovered = validation_status([126, 0], at)
    assert recovered["ready"] and recovered["lastState"]["terminated"]["exitCode"] == 126

    body = pod_status_patch("10.244.0.5", "10.244.0.1", [looping], [], ["app", "istio-proxy"], at)["status"]
    assert body["phase"] == "Pending" and body["podIP"] == "10.244.0.5"
    assert body["initContainerStatuses"] == [looping]
    assert [c["state"]["waiting"] for c in body["containerStatuses"]] == [{"reason": "PodInitializing"}] * 2
    ok = pod_status_patch("10.244.0.5", "10.244.0.1", [passed], ["app", "istio-proxy"], [], at)["status"]
    assert ok["phase"] == "Running"
    assert {c["type"]: c["status"] for c in ok["conditions"]}["Ready"] == "True"
