"""`LocalNode.add_pods` builds pods concurrently (root, CNI mode): each its own namespace, address, capture
and agent, a failing pod does not stop the others, and `close()` leaves nothing.

The pods' sandboxes and init containers run in worker threads while the calling thread starts their
processes (`add_pods`); `wait_ready` probes every pod's :15021 from the node namespace as a kubelet does.
What is checked here is what concurrency could break: two pods given one address or one namespace, a
host-local lease lost, a pod's capture or validation missing, a status report of one pod landing on
another, a process dying with the worker thread that was near it, something left behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from launchers import RegistryFile, local_node
from needs import need, need_root, need_tool
from support import netns_names

from istiod_local.node.cni_plan import NETWORK_NAME
from istiod_local.node.local_node import LocalNode, PodInitError
from istiod_local.node.plan import PodSpec, registry_workloads
from istiod_local.node.processes import pid_alive

PY = sys.executable
SLEEPER = [PY, "-c", "import time; time.sleep(3600)"]
ECHO = [PY, "-m", "istiod_local.node.echo_app", "serve", "--port", "8080"]


def _needs() -> None:
    need_root()
    for tool in ("ip", "setpriv", "nsenter", "iptables-save"):
        need_tool(tool)
    for plugin in ("bridge", "host-local", "loopback"):
        need(Path(f"/usr/lib/cni/{plugin}").is_file(), f"needs containernetworking-plugins' {plugin}")




def _eth0_addresses(netns: str) -> list[str]:
    out = subprocess.run(["ip", "-n", netns, "-j", "addr", "show", "dev", "eth0"], capture_output=True, text=True,
                         check=True).stdout
    return [entry["local"] for link in json.loads(out) for entry in link["addr_info"] if entry["family"] == "inet"]


def _rules(netns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", netns, "iptables-save"], capture_output=True, text=True,
                          check=True).stdout


def _leases(node: LocalNode) -> set[str]:
    assert node.cni is not None
    folder = node.cni.paths.ipam_dir / NETWORK_NAME
    return {p.name for p in folder.iterdir() if p.name[0].isdigit()} if folder.exists() else set()


def test_pods_added_at_once_each_get_their_own_network_capture_and_agent_and_close_removes_all() -> None:
    _needs()
    specs = [PodSpec(f"sc-{i}", service_account="sleep", labels={"app": "sleep"}) for i in range(5)]
    specs.append(PodSpec("echo-1", service_account="echo", labels={"app": "echo"}, app=ECHO))
    with local_node("iaconc-", ready_timeout=60, capture="cni", start_parallelism=4) as node:
        plans = node.plan_pods(specs)
        RegistryFile(node.registry, yaml.safe_dump({"workloads": registry_workloads(plans)}))
        node.start_istiod()
        pods = node.add_pods(plans)
        node.wait_ready(pods, {"echo-1": 8080})
        assert [pod.name for pod in pods] == [spec.name for spec in specs]  # in the order given
        assert len({pod.ip for pod in pods}) == len({pod.netns for pod in pods}) == len(pods)
        for pod, plan in zip(pods, plans, strict=True):
            assert pod.attachment is not None and pod.attachment.address == plan.ip
            assert _eth0_addresses(pod.netns) == [plan.ip]  # the address is in its own namespace
            assert pod.validation == [0]
            assert "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001" in _rules(pod.netns)
            assert pod.agent is not None and pod.agent.running()  # started by the calling thread: still alive
        assert _leases(node) == {pod.ip for pod in pods}
        assert node.cni is not None and node.cni.api is not None
        for pod in pods:  # each status report landed on its own pod
            api_pod = node.cni.api.get_pod("default", pod.name)
            assert api_pod is not None and api_pod["status"]["podIP"] == pod.ip
            assert {c["name"] for c in api_pod["status"]["containerStatuses"]} >= {"istio-proxy"}
        assert node.cni.status_errors == []
        pids = [proc.pid for pod in pods for proc in pod.processes()]
        prefix, runtime = node.plan.prefix, node.runtime.path
    assert not [pid for pid in pids if pid_alive(pid)]
    assert not [name for name in netns_names() if name.startswith(prefix)]
    assert not runtime.exists()


def test_a_pod_failing_among_others_is_raised_and_the_others_still_start() -> None:
    _needs()
    specs = [PodSpec("ok-1", agent=False, app=SLEEPER),
             PodSpec("bad-1", namespace="kube-system", agent=False, app=SLEEPER),
             PodSpec("ok-2", agent=False, app=SLEEPER)]
    with local_node("iaconc-", ready_timeout=30, capture="cni", cni_repair="off", start_parallelism=3) as node:
        plans = node.plan_pods(specs)
        RegistryFile(node.registry, yaml.safe_dump({"workloads": registry_workloads(plans)}))
        node.start_istiod()
        with pytest.raises(PodInitError) as raised:
            node.add_pods(plans)
        # kube-system is excluded: istio-cni skips the pod, its capture is missing, istio-validation fails.
        assert raised.value.pod.name == "bad-1" and raised.value.exit_codes == [126, 126]
        assert set(node.pods) == {"ok-1", "bad-1", "ok-2"}
        assert node.pods["bad-1"].app is None  # not started after its init container failed
        for name in ("ok-1", "ok-2"):
            app = node.pods[name].app
            assert app is not None and app.running(), name
        assert _leases(node) == {plan.ip for plan in plans}  # the failed pod keeps its sandbox, as on a node
        prefix = node.plan.prefix
    assert not [name for name in netns_names() if name.startswith(prefix)]
