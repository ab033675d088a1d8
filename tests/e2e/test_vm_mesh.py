"""VMs on the local node joining the mesh through the VM guide's steps (root, real Envoys, real capture).

One node for the module: istiod-local with a WorkloadGroup `vm` in namespace
`vmns` (service account `vm-sa`, labels app=vm, port http 8080, an HTTP
readiness probe on the app), the service `vm.vmns` (10.96.0.30:80 → 8080)
selecting it, the pod `echo-1` (sidecar with DNS capture, the echo app behind
`echo.default`), and two VMs, each built from its onboarding files
(`istiod-local workload-entry configure --autoregister`) and started with
`packaging/vm/istio-start.sh` as istio.service runs it, with the echo app
beside it. Both namespaces are STRICT. istiod-local's grace period for a
disconnected auto-registered entry is short (`--workload-entry-grace-period`).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from launchers import RegistryFile, local_node
from needs import need_root, need_tool
from support import poll

from istiod_local.controlplane.xds.autoregistration import entry_name
from istiod_local.node.demo import ECHO_SERVICE
from istiod_local.node.local_node import LocalNode, Pod
from istiod_local.node.plan import PodSpec, registry_workloads
from istiod_local.node.vm import Vm, VmSpec

PY = sys.executable
ECHO_APP = [PY, "-m", "istiod_local.node.echo_app", "serve", "--port", "8080"]
VM_VIP = "10.96.0.30"
VM_HOST = "vm.vmns.svc.cluster.local"
VM_SPIFFE = "spiffe://cluster.local/ns/vmns/sa/vm-sa"
ECHO_SPIFFE = "spiffe://cluster.local/ns/default/sa/echo"
VM_CLUSTER = f"outbound|80||{VM_HOST}"
GRACE = "3s"
PROBE = {"periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 2, "successThreshold": 1,
         "httpGet": {"path": "/", "port": 8080}}
REGISTRY: dict[str, Any] = {
    "services": [ECHO_SERVICE, {"name": "vm", "namespace": "vmns", "selector": {"app": "vm"}, "clusterIP": VM_VIP,
                                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "HTTP"}]}],
    "workloadGroups": [{"name": "vm", "namespace": "vmns", "metadata": {"labels": {"app": "vm"}},
                        "template": {"serviceAccount": "vm-sa", "ports": {"http": 8080}}, "probe": PROBE}],
    "peerAuthentication": {"default": "STRICT", "vmns": "STRICT"},
}


class Mesh:
    def __init__(self, node: LocalNode, pod: Pod, vms: dict[str, Vm]) -> None:
        self.node, self.pod, self.vms = node, pod, vms

    def from_pod(self, url: str, timeout: float = 3.0) -> dict[str, Any]:
        done = self.node.exec(self.pod, [PY, "-m", "istiod_local.node.echo_app", "get", url, "--timeout",
                                         str(timeout)])
        return _answer(done.stdout, done.stderr)

    def from_vm(self, name: str, url: str, timeout: float = 3.0) -> dict[str, Any]:
        done = self.node.vm_exec(name, [PY, "-m", "istiod_local.node.echo_app", "get", url, "--timeout",
                                        str(timeout)])
        return _answer(done.stdout, done.stderr)

    def vm_endpoints(self) -> set[str]:
        """The addresses the pod's Envoy holds for the VM service (from EDS)."""
        text = self.node.envoy_admin(self.pod, "clusters")
        return {line.split("::")[1].rsplit(":", 1)[0] for line in text.splitlines()
                if line.startswith(VM_CLUSTER + "::") and line.split("::")[2].startswith("cx_active")}

    def istiod_log(self) -> str:
        return (self.node.logs / "istiod.log").read_text(errors="replace")


def _answer(stdout: str, stderr: str) -> dict[str, Any]:
    try:
        answer: dict[str, Any] = json.loads(stdout)
    except ValueError:
        answer = {"error": stderr.strip()[-300:] or stdout[-300:]}
    return answer


@pytest.fixture(scope="module")
def mesh() -> Iterator[Mesh]:
    need_root()
    for tool in ("ip", "setpriv", "iptables", "nsenter", "unshare", "hostname"):
        need_tool(tool)
    with local_node("ia-vm-", ready_timeout=60) as node:
        (plan,) = node.plan_pods([PodSpec("echo-1", service_account="echo", labels={"app": "echo"}, app=ECHO_APP,
                                          dns_capture=True)])
        RegistryFile(node.registry).write({**REGISTRY, "workloads": registry_workloads([plan])})
        node.start_istiod(["--workload-entry-grace-period", GRACE])
        pod = node.add_pod(plan)
        vms = {name: node.add_vm(VmSpec(name, "vm", "vmns", app=ECHO_APP)) for name in ("vm-1", "vm-2")}
        node.wait_ready([pod], {"echo-1": 8080})
        for machine in vms.values():
            node.wait_vm_ready(machine)
        yield Mesh(node, pod, vms)


def test_vm_joins_through_its_onboarding_files_and_the_start_script(mesh: Mesh) -> None:
    """Auto-registered (both VMs in the pod's EDS); pod → VM by DNS name over mTLS with the VM's identity."""
    want = {machine.ip for machine in mesh.vms.values()}
    assert poll(lambda: mesh.vm_endpoints() == want and want, "both VMs in the pod's EDS for vm.vmns")
    answer = poll(lambda: (a := mesh.from_pod(f"http://{VM_HOST}/")).get("status") == 200 and a,
                  "the VM service to answer the pod by name")
    assert answer["body"]["pod"] in mesh.vms
    xfcc = answer["body"]["headers"]["x-forwarded-client-cert"]
    assert f"By={VM_SPIFFE}" in xfcc and f"URI={ECHO_SPIFFE}" in xfcc, xfcc
    # The start script ran the agent as istio-proxy with its output in the VM's /var/log/istio.
    machine = mesh.vms["vm-1"]
    assert (Path(machine.root) / "var/log/istio/istio.log").stat().st_size > 0
    owner = mesh.node.vm_exec(machine, ["ps", "-o", "user=", "-p", str(machine.agent.pid if machine.agent
                                                                        else 0)])
    assert owner.stdout.strip() in ("istio-proxy", "1337"), owner
    # The capture the script applied from cluster.env: inbound the group's port, outbound *, DNS to the
    # VM's nameserver.
    rules = mesh.node.vm_exec(machine, ["iptables-save"]).stdout
    assert "-A ISTIO_INBOUND -p tcp -m tcp --dport 8080 -j ISTIO_IN_REDIRECT" in rules, rules
    assert "-A ISTIO_OUTPUT -j ISTIO_REDIRECT" in rules
    assert "-A ISTIO_OUTPUT_DNS -d 127.0.0.1/32 -p udp -m udp --dport 53 -j REDIRECT --to-ports 15053" in rules


def test_vm_reaches_the_pods_service_with_its_own_identity(mesh: Mesh) -> None:
    answer = poll(lambda: (a := mesh.from_vm("vm-1", "http://echo.default.svc.cluster.local/")).get("status")
                  == 200 and a, "the pod's service to answer the VM")
    assert answer["body"]["pod"] == "echo-1"
    assert f"URI={VM_SPIFFE}" in answer["body"]["headers"]["x-forwarded-client-cert"]


def test_onboarding_files_are_consumed_at_the_guides_paths(mesh: Mesh) -> None:
    """What the start script and agent read on the VM: the guide's absolute paths, upstream's keys."""
    machine = mesh.vms["vm-1"]
    onboarding = Path(machine.onboarding)
    assert sorted(p.name for p in onboarding.iterdir()) == sorted(
        ["cluster.env", "hosts", "istio-token", "mesh.yaml", "root-cert.pem"])
    seen = mesh.node.vm_exec(machine, ["sh", "-c", "cat /etc/certs/root-cert.pem; echo ===; "
                                       "cat /var/run/secrets/tokens/istio-token; echo ===; cat /etc/istio/config/mesh;"
                                       " echo ===; cat /var/lib/istio/envoy/cluster.env; echo ===; cat /etc/hosts;"
                                       " echo ===; hostname"])
    root, token, meshfile, cluster, hosts, hostname = seen.stdout.split("===\n")
    assert root.strip() == (onboarding / "root-cert.pem").read_text().strip()
    assert token.strip() == (onboarding / "istio-token").read_text().strip()
    assert meshfile.strip() == (onboarding / "mesh.yaml").read_text().strip()
    assert cluster.strip() == (onboarding / "cluster.env").read_text().strip()
    assert (onboarding / "hosts").read_text().strip() in hosts
    assert hostname.strip() == "vm-1"
    for key in ("ISTIO_INBOUND_PORTS", "ISTIO_LOCAL_EXCLUDE_PORTS", "ISTIO_SERVICE_CIDR", "ISTIO_NAMESPACE",
                "ISTIO_SERVICE", "SERVICE_ACCOUNT", "ISTIO_META_AUTO_REGISTER_GROUP", "ISTIO_SVC_IP"):
        assert f"\n{key}=" in "\n" + cluster, key
    # The agent was given what cluster.env says (its environment, read from /proc on the VM).
    assert machine.agent is not None
    environ = Path(f"/proc/{machine.agent.pid}/environ").read_bytes().split(b"\0")
    assert b"ISTIO_META_AUTO_REGISTER_GROUP=vm" in environ and b"POD_NAME=vm-1" in environ
    assert f"INSTANCE_IP={machine.ip}".encode() in environ and b"POD_NAMESPACE=vmns" in environ


def test_failing_probe_takes_the_vm_out_of_eds_and_back_with_no_failed_requests(mesh: Mesh) -> None:
    both = {machine.ip for machine in mesh.vms.values()}
    poll(lambda: mesh.vm_endpoints() == both, "both VMs in EDS")
    stopped = mesh.vms["vm-2"]
    mesh.node.stop_vm_app(stopped)
    try:
        poll(lambda: mesh.vm_endpoints() == {mesh.vms["vm-1"].ip}, "vm-2 to leave EDS after its probe failed",
             timeout=20)
        served: list[dict[str, Any]] = []
        failed: list[dict[str, Any]] = []
        for _ in range(20):  # the endpoint is unhealthy: every request must reach vm-1
            answer = mesh.from_pod(f"http://{VM_HOST}/")
            (served if answer.get("status") == 200 else failed).append(answer)
        assert failed == [], failed
        assert {a["body"]["pod"] for a in served} == {"vm-1"}
        assert mesh.vm_endpoints() == {mesh.vms["vm-1"].ip}
    finally:
        mesh.node.start_vm_app(stopped)
    poll(lambda: mesh.vm_endpoints() == both, "vm-2 back in EDS once its app answers", timeout=20)


def test_killed_agent_leaves_after_the_grace_period_and_returns_when_restarted(mesh: Mesh) -> None:
    machine = mesh.vms["vm-2"]
    both = {m.ip for m in mesh.vms.values()}
    poll(lambda: mesh.vm_endpoints() == both, "both VMs in EDS")
    assert machine.agent is not None
    machine.agent.signal(signal.SIGKILL)
    machine.agent.wait(10)
    assert machine.ip in mesh.vm_endpoints()  # kept while the grace period runs (3 s)
    poll(lambda: mesh.vm_endpoints() == {mesh.vms["vm-1"].ip}, "vm-2's WorkloadEntry to go after the grace",
         timeout=30)
    entry = f"vmns/{entry_name('vm', machine.ip)}"
    assert f"cleaned up auto-registered WorkloadEntry {entry}" in mesh.istiod_log()
    mesh.node.stop_vm_agent(machine)  # ExecStopPost's clean, as systemd runs it after the kill
    mesh.node.start_vm_agent(machine)  # Restart=always
    mesh.node.wait_vm_ready(machine)
    poll(lambda: mesh.vm_endpoints() == both, "vm-2 back in EDS after its agent restarted", timeout=30)


def test_token_of_another_service_account_cannot_register_into_the_group(mesh: Mesh) -> None:
    node = mesh.node
    intruder = node.add_vm(VmSpec("vm-3", "vm", "vmns"), start=False)
    mesh.vms["vm-3"] = intruder
    other = node.workdir / "intruder-files"
    subprocess.run([str(node.options.bin_dir / "istiod-local"), "pod-files", "--state-dir", str(node.istiod_state),
                    "--namespace", "vmns", "--service-account", "intruder", "--pod", "vm-3", "--out", str(other)],
                   check=True, capture_output=True, timeout=60)
    token = Path(intruder.root) / "var/run/secrets/tokens/istio-token"
    shutil.copyfile(other / "var/run/secrets/tokens/istio-token", token)
    node.start_vm_agent(intruder)
    line = poll(lambda: next((ln for ln in mesh.istiod_log().splitlines()
                              if "refused" in ln and f"~{intruder.ip}~vm-3." in ln), None),
                "istiod-local to log why vm-3 was refused", timeout=30)
    # The reason names the token's service account and the one the VM claims (its cluster.env's, the group's).
    assert "'intruder'" in line and "'vm-sa'" in line, line
    assert intruder.ip not in mesh.vm_endpoints()
