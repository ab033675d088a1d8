"""Every pod's agent runs as the istio-proxy container's user, 1337, never as root (root, network namespaces).

One node: istiod-local, two sidecar pods (`client-1`, `echo-1` behind the echo
service, STRICT mTLS) and a proxyless pod (`pl-1`). The checks read the
kernel's view: /proc/<pid>/status of each agent and Envoy (uids, gids,
groups, capabilities, no_new_privs), the owners and modes in the pod
directories, and what a command run in the pod as 1337 or as another
non-root uid can read there and in istiod-local's state (the CA key).
"""

from __future__ import annotations

import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from launchers import RegistryFile, local_node
from needs import need_root, need_tool

from istiod_local.node.container import WRITABLE_VOLUMES
from istiod_local.node.demo import CLIENT_SPIFFE, ECHO_SERVICE, ECHO_SPIFFE, ECHO_URL, registry_yaml, request
from istiod_local.node.local_node import LocalNode, Pod
from istiod_local.node.plan import PodSpec, as_user
from istiod_local.node.processes import netns_pids

ECHO_APP = [sys.executable, "-m", "istiod_local.node.echo_app", "serve", "--port", "8080"]
OTHER_UID = 4242  # another non-root user in the pod, e.g. an app container's
NO_CAPABILITIES = "0" * 16


class Node:
    def __init__(self, node: LocalNode, pods: dict[str, Pod]) -> None:
        self.node, self.pods = node, pods

    def run_as(self, uid: int, pod: str, *argv: str) -> tuple[int, str]:
        """`argv` as `uid` (group the same, no other groups) in the agent's container, as `kubectl exec` runs it:
        the pod's network namespace and the agent's mount namespace (its image: the node's interpreter)."""
        agent = self.pods[pod].agent
        assert agent is not None
        done = subprocess.run(["nsenter", "-t", str(agent.pid), "-m", "-n", *as_user(uid, uid), "--", *argv],
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        return done.returncode, (done.stdout + done.stderr).strip()


@pytest.fixture(scope="module")
def mesh() -> Iterator[Node]:
    need_root()
    for tool in ("ip", "setpriv", "unshare", "mount", "nsenter", "iptables"):
        need_tool(tool)
    with local_node("ia-agent-user-", ready_timeout=60) as node:
        plans = node.plan_pods([
            PodSpec("client-1", service_account="sleep", labels={"app": "sleep"}),
            PodSpec("echo-1", service_account="echo", labels={"app": "echo"}, app=ECHO_APP),
            PodSpec("pl-1", service_account="greeter", labels={"app": "greeter"}, proxyless=True),
        ])
        RegistryFile(node.registry).write(registry_yaml(plans, [ECHO_SERVICE], "STRICT"))
        node.start_istiod()
        pods = {pod.name: pod for pod in node.add_pods(plans)}
        node.wait_ready(pods.values(), {"echo-1": 8080})
        yield Node(node, pods)


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _libpython(pid: int | str) -> set[str]:
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {line.split()[-1] for line in maps if "libpython" in line}


def _assert_proxy_user(pid: int) -> None:
    status = _status(pid)
    assert status["Uid"].split() == ["1337"] * 4, status["Uid"]  # real, effective, saved, filesystem
    assert status["Gid"].split() == ["1337"] * 4, status["Gid"]
    assert status["Groups"] == ""
    assert (status["CapEff"], status["CapPrm"], status["CapBnd"]) == (NO_CAPABILITIES,) * 3
    assert status["NoNewPrivs"] == "1"


@pytest.mark.parametrize("name", ["client-1", "echo-1", "pl-1"])
def test_the_agent_runs_as_1337_with_no_capabilities(mesh: Node, name: str) -> None:
    agent = mesh.pods[name].agent
    assert agent is not None and agent.running()
    assert "pilot-agent" in Path(f"/proc/{agent.pid}/cmdline").read_bytes().decode()
    _assert_proxy_user(agent.pid)
    assert _libpython(agent.pid) == _libpython("self")  # the node's own interpreter, through the agent's image


def test_envoy_runs_as_the_agents_user_and_only_the_app_as_root(mesh: Node) -> None:
    for name in ("client-1", "echo-1"):
        pod = mesh.pods[name]
        app = pod.app.pid if pod.app is not None else None
        running = {pid: _comm(pid) for pid in netns_pids(pod.netns) if pid != app}
        envoys = [pid for pid, comm in running.items() if comm == "envoy"]
        assert len(envoys) == 1, running
        for pid, comm in running.items():
            if comm in ("envoy", "pilot-agent"):
                _assert_proxy_user(pid)


def test_mtls_between_two_pods_carries_the_clients_identity(mesh: Node) -> None:
    answer = request(mesh.node, mesh.pods["client-1"], ECHO_URL, time.monotonic() + 60)
    xfcc = answer["body"]["headers"].get("x-forwarded-client-cert", "")
    assert f"URI={CLIENT_SPIFFE}" in xfcc and f"By={ECHO_SPIFFE}" in xfcc, answer


@pytest.mark.parametrize("name", ["echo-1", "pl-1"])
def test_the_agent_owns_its_volumes_and_only_reads_the_mounted_files(mesh: Node, name: str) -> None:
    pod = mesh.pods[name]
    for volume in WRITABLE_VOLUMES:
        info = (pod.dir / volume).stat()
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (1337, 1337, 0o750), volume
    token = "var/run/secrets/tokens/istio-token"
    for path in (token, "var/run/secrets/istio/root-cert.pem", "etc/istio/pod/labels", "etc/istio/pod/annotations"):
        info = (pod.dir / path).stat()
        assert info.st_uid == 0 and not info.st_mode & 0o022, path  # root's; neither group nor others write
        file = pod.dir / path
        code, out = mesh.run_as(1337, name, "sh", "-c", f"cat {file} >/dev/null && echo x >> {file}")
        assert code != 0 and "Permission denied" in out, (path, out)  # 1337 reads it, cannot change it
    code, out = mesh.run_as(OTHER_UID, name, "cat", str(pod.dir / token))
    assert code != 0 and "Permission denied" in out  # only the istio-proxy container's user reads the token


def test_another_uid_in_the_pod_reaches_neither_the_ca_key_nor_the_agents_secrets(mesh: Node) -> None:
    state = mesh.node.istiod_state
    assert (state / "root-key.pem").is_file()
    for uid in (1337, OTHER_UID):
        for argv in (["cat", str(state / "root-key.pem")], ["ls", str(state)]):
            code, out = mesh.run_as(uid, "pl-1", *argv)
            assert code != 0 and "Permission denied" in out, (uid, argv, out)
    pl = mesh.pods["pl-1"].dir
    key = pl / "var/lib/istio/data/key.pem"  # OUTPUT_CERTS, written by the agent as 1337
    assert key.stat().st_uid == 1337
    code, _ = mesh.run_as(1337, "pl-1", "cat", str(key))
    assert code == 0  # (the check below is about the user, not a missing file)
    code, out = mesh.run_as(OTHER_UID, "pl-1", "cat", str(key))
    assert code != 0 and "Permission denied" in out, out
    sds = mesh.pods["echo-1"].dir / "var/run/secrets/workload-spiffe-uds/socket"  # what hands out the key
    assert sds.is_socket()
    connect = f"import socket; socket.socket(socket.AF_UNIX).connect({str(sds)!r})"
    code, out = mesh.run_as(OTHER_UID, "echo-1", sys.executable, "-c", connect)
    assert code != 0 and "PermissionError" in out, out
    code, out = mesh.run_as(1337, "echo-1", sys.executable, "-c", connect)
    assert code == 0, out  # Envoy's user does connect
