"""The local node in real network namespaces (root): build, pods, capture, teardown, leftovers.

Checks look at the kernel, not at our own bookkeeping: `ip netns list`, the
links and routes inside each namespace, `iptables-save` in the pod, the owner
of Envoy's process, and whether recorded pids still run after teardown.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from launchers import RegistryFile, local_node
from needs import need_root, need_tool
from support import host_links, netns_names, open_workdir, poll

from istiod_local.node.local_node import LocalNode, NodeOptions, sweep_stale_namespaces
from istiod_local.node.plan import PodPlan, PodSpec, registry_workloads
from istiod_local.node.processes import NodeError, netns_pids, pid_alive

PY = sys.executable
SLEEPER = [PY, "-c", "import time; time.sleep(3600)"]
ECHO = [PY, "-m", "istiod_local.node.echo_app", "serve", "--port", "8080"]
REACH = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()
    print("open")
except ConnectionRefusedError:
    print("refused")
except OSError as exc:
    print("unreachable", exc)
"""


@pytest.fixture(autouse=True)
def _tools() -> None:
    need_root()
    for tool in ("ip", "setpriv", "iptables-save"):
        need_tool(tool)






def _in(netns: str, *argv: str) -> str:
    return subprocess.run(["ip", "netns", "exec", netns, *argv], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A fresh work directory, removed afterwards (one under a 0700 directory works too: test_node_runtime.py)."""
    with open_workdir("ia-test-") as path:
        yield path / "node"


@pytest.fixture
def node() -> Iterator[LocalNode]:
    with local_node("ia-test-", ready_timeout=30) as local:
        yield local


def test_node_and_plain_pod_are_built_and_removed_without_leftovers(workdir: Path) -> None:
    links_before = host_links()
    local = LocalNode(NodeOptions(workdir=workdir))
    local.create()
    try:
        assert local.plan.netns in netns_names()
        assert "br0" in _in(local.plan.netns, "ip", "-o", "addr", "show")
        pod = local.add_pod(PodSpec("plain-1", sidecar=False, app=SLEEPER))
        assert pod.netns in netns_names()
        addresses = _in(pod.netns, "ip", "-o", "-4", "addr", "show", "dev", "eth0")
        assert f"inet {pod.ip}/24" in addresses
        assert "default via 10.244.0.1 dev eth0" in _in(pod.netns, "ip", "route")
        assert "master br0" in _in(local.plan.netns, "ip", "-o", "link", "show", pod.node_veth)
        # The pod reaches the node's gateway over the veth and bridge: a closed port answers "refused".
        assert _in(pod.netns, PY, "-c", REACH, "10.244.0.1", "9").strip() == "refused"
        assert host_links() == links_before  # nothing was created in the host's namespace
        assert pod.app is not None
        app_pid = pod.app.pid
        assert app_pid in netns_pids(pod.netns)
        pod_dir = pod.dir
    finally:
        local.close()
    assert not {name for name in netns_names() if name.startswith(local.plan.prefix)}
    assert not pid_alive(app_pid)
    assert not pod_dir.exists()
    assert host_links() == links_before
    assert (local.logs / "plain-1-app.log").exists()  # logs stay in a caller-given workdir


def test_sidecar_pod_gets_capture_rules_and_envoy_runs_as_1337(node: LocalNode) -> None:
    echo_plan, = node.plan_pods([PodSpec("echo-1", service_account="echo", labels={"app": "echo"}, app=ECHO)])
    RegistryFile(node.registry, _registry([echo_plan]))
    node.start_istiod()
    echo = node.add_pod(echo_plan)
    node.wait_ready([echo], {"echo-1": 8080})

    rules = _in(echo.netns, "iptables-save") + _legacy_rules(echo.netns)
    for expected in ("-A ISTIO_INBOUND", "-A ISTIO_OUTPUT", "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001",
                     "-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006", "--uid-owner 1337",
                     "--gid-owner 1337"):
        assert expected in rules, rules
    assert not any("ISTIO" in line for line in _in(node.plan.netns, "iptables-save").splitlines())

    owners: dict[str, set[int]] = {}
    for pid in netns_pids(echo.netns):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            uid = next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                       if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        owners.setdefault(comm, set()).add(int(uid))
    assert owners.get("envoy") == {1337}, owners

    labels = (echo.dir / "etc/istio/pod/labels").read_text()
    assert labels == 'app="echo"\n'
    assert (echo.dir / "var/run/secrets/tokens/istio-token").exists()
    assert (echo.dir / "var/run/secrets/workload-spiffe-uds/socket").is_socket()
    config = node.envoy_admin(echo, "config_dump?resource=dynamic_active_clusters")
    assert "inbound|8080||" in config


def _legacy_rules(netns: str) -> str:
    done = subprocess.run(["ip", "netns", "exec", netns, "iptables-legacy-save"], capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else ""


def _registry(pods: list[PodPlan]) -> str:
    return yaml.safe_dump({
        "services": [{"name": "echo", "namespace": "default", "selector": {"app": "echo"}, "clusterIP": "10.96.0.20",
                      "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "HTTP"}]}],
        "workloads": registry_workloads(pods),
    })


def test_a_pod_whose_agent_fails_is_reported_and_everything_is_still_removed(workdir: Path) -> None:
    local = LocalNode(NodeOptions(workdir=workdir, ready_timeout=30))
    local.create()
    try:
        plan, = local.plan_pods([PodSpec("broken-1", agent_env={"PROXY_CONFIG": "{not json nor: [yaml"})])
        RegistryFile(local.registry, yaml.safe_dump({"workloads": registry_workloads([plan])}))  # the API's pods
        local.start_istiod()
        broken = local.add_pod(plan)
        with pytest.raises(NodeError, match="broken-1 pilot-agent exited with 1"):
            local.wait_ready([broken])
        assert local.istiod is not None
        istiod_pid = local.istiod.pid
    finally:
        local.close()
    assert not pid_alive(istiod_pid)
    assert not {name for name in netns_names() if name.startswith(local.plan.prefix)}


def test_close_is_idempotent_and_a_closed_node_refuses_pods(workdir: Path) -> None:
    local = LocalNode(NodeOptions(workdir=workdir))
    local.create()
    local.close()
    local.close()
    with pytest.raises(NodeError, match="not running"):
        local.add_pod(PodSpec("late-1", sidecar=False))


def test_namespaces_of_a_dead_owner_are_swept_with_their_processes() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead_owner = gone.pid
    names = [f"ia-{dead_owner}-0-node", f"ia-{dead_owner}-0-pod-1"]
    for name in names:
        subprocess.run(["ip", "netns", "add", name], check=True)
    orphan = subprocess.Popen(["ip", "netns", "exec", names[1], *SLEEPER])
    try:
        poll(lambda: orphan.pid in netns_pids(names[1]), "the orphan to run in its namespace", 10)
        sweep_stale_namespaces()  # (another test run on this machine may sweep them first: same end state)
        assert not set(names) & netns_names()
        assert orphan.wait(10) != 0  # killed by the sweep
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()
        for name in names:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def test_a_live_owners_namespaces_are_not_swept() -> None:
    live = f"ia-{os.getppid()}-0-node"  # our parent runs (pytest's launcher or the shell)
    subprocess.run(["ip", "netns", "add", live], check=True)
    try:
        assert live not in sweep_stale_namespaces()
        assert live in netns_names()
    finally:
        subprocess.run(["ip", "netns", "delete", live], check=True)
