"""The node's runtime directory: a checkout in a 0700 home directory runs, and nothing of the node outlives it.

Envoy runs as uid 1337, which cannot enter a 0700 directory (a home such as
/root, and so a checkout and its venv there). The node keeps what that uid
needs, the pod directories and a reachable Envoy, under
/run/istio-agent-node/<pid>-<n>/ and removes it on close; a dead owner's
directory is swept by the next node. The checks look at the kernel and the
file system: the uid and executable of the running Envoy, its working
directory, `ip netns`, host links, the mount table, and what is left on disk.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from launchers import RegistryFile
from needs import need_root, need_tool
from support import host_links, netns_names

from istiod_local.node.local_node import LocalNode, NodeOptions, sweep_stale_runs
from istiod_local.node.plan import PROXY_UID, PodSpec, registry_workloads
from istiod_local.node.processes import netns_pids, pid_alive
from istiod_local.node.runtime import NodeRuntime, envoy_binary, stale_runtime_dirs, sweep_stale_runtime

ECHO = [sys.executable, "-m", "istiod_local.node.echo_app", "serve", "--port", "8080"]
TOOL = "#!/bin/sh\necho ran as $(id -u)\n"


# ---- pure -----------------------------------------------------------------------------------------


def test_stale_runtime_dirs_are_those_of_dead_owners_and_never_our_own() -> None:
    alive = {10, 20}.__contains__
    names = ["10-0", "30-0", "30-1", "20-2", "99-0", "mountpoints", "30-x", "7"]
    assert stale_runtime_dirs(names, alive, own_pid=99) == ["30-0", "30-1"]


# ---- on disk (root: the checks run things as uid 1337) ---------------------------------------------


@pytest.fixture
def private_dir() -> Iterator[Path]:
    """A fresh 0700 directory, as a home directory is: uid 1337 cannot enter it. Removed afterwards."""
    need_root()
    need_tool("setpriv")
    path = Path(tempfile.mkdtemp(prefix="ia-private-"))
    try:
        assert path.stat().st_mode & 0o777 == 0o700
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def runtime_root() -> Iterator[Path]:
    """A runtime root of this test's own (not yet made), so it never touches live nodes' directories."""
    base = Path(tempfile.mkdtemp(prefix="ia-runtime-"))
    base.chmod(0o755)
    try:
        yield base / "root"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def as_proxy_user(binary: Path) -> str:
    done = subprocess.run(["setpriv", "--reuid", str(PROXY_UID), "--regid", str(PROXY_UID), "--clear-groups",
                           str(binary)], capture_output=True, text=True, timeout=30)
    return done.stdout.strip() or done.stderr.strip()


def tool(folder: Path, mode: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tool"
    path.write_text(TOOL)
    path.chmod(mode)
    return path


def test_envoy_is_linked_or_copied_only_when_uid_1337_cannot_reach_it(private_dir: Path, runtime_root: Path) -> None:
    runtime = NodeRuntime(runtime_root, 4242, 0)
    runtime.create()
    for level in (runtime_root, runtime.path, runtime.pod_root, runtime.envoy.parent):
        assert level.stat().st_mode & 0o777 == 0o711, level

    hidden = tool(private_dir / "venv", 0o755)
    assert "Permission denied" in as_proxy_user(hidden)
    path, how = runtime.envoy_for(hidden)
    assert (path, how) == (runtime.envoy, "hard link")
    assert path.stat().st_ino == hidden.stat().st_ino  # no copy of the 107 MB binary
    assert as_proxy_user(path) == f"ran as {PROXY_UID}"
    assert runtime.envoy_for(hidden) == (runtime.envoy, "hard link")  # idempotent
    runtime.envoy.unlink()

    owner_only = tool(private_dir / "venv2", 0o700)  # a link would keep that mode: copy it 0755
    path, how = runtime.envoy_for(owner_only)
    assert (path, how) == (runtime.envoy, "copy")
    assert path.stat().st_mode & 0o777 == 0o755 and path.stat().st_ino != owner_only.stat().st_ino
    assert as_proxy_user(path) == f"ran as {PROXY_UID}"

    public = tool(runtime_root.parent / "bin", 0o755)
    assert runtime.envoy_for(public) == (public, "as is")

    runtime.remove()
    assert not runtime_root.exists()
    assert hidden.exists() and owner_only.exists()


def test_a_dead_owners_runtime_directory_is_swept_and_a_live_ones_kept(runtime_root: Path) -> None:
    need_root()
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead, live = NodeRuntime(runtime_root, gone.pid, 0), NodeRuntime(runtime_root, os.getppid(), 0)
    for runtime in (dead, live):
        runtime.create()
        (runtime.pod_root / "echo-1").mkdir()
        (runtime.pod_root / "echo-1" / "token").write_text("x")
    (dead.envoy.with_name(".envoy.partial")).write_text("half a copy")  # killed mid-copy

    assert sweep_stale_runtime(runtime_root, pid_alive, os.getpid()) == [dead.path]
    assert not dead.path.exists() and live.path.exists()
    live.remove()
    assert not runtime_root.exists()


# ---- a whole node from a 0700 work directory ---------------------------------------------------






def _mounts_under(*paths: Path) -> list[str]:
    table = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line for line in table if any(str(path) in line for path in paths)]


def _uid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(line.split()[1] for line in status if line.startswith("Uid:")))


def _named(pids: list[int], comm: str) -> list[int]:
    found = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == comm:
                found.append(pid)
        except OSError:
            continue
    return found


def test_a_node_working_in_a_0700_directory_runs_envoy_as_1337_and_teardown_leaves_nothing(
        private_dir: Path) -> None:
    for name in ("ip", "iptables-save"):
        need_tool(name)
    # A checkout in a home directory: the work directory, and the venv's Envoy, sit where uid 1337 cannot go.
    checkout = private_dir / "checkout"
    (checkout / "venv").mkdir(parents=True)
    envoy = checkout / "venv" / "envoy"
    try:
        os.link(envoy_binary(), envoy)
    except OSError:
        shutil.copy2(envoy_binary(), envoy)
    links_before = host_links()
    node = LocalNode(NodeOptions(workdir=checkout / "run" / "node", envoy_binary=str(envoy), ready_timeout=30))
    node.create()
    try:
        runtime = node.runtime.path
        echo_plan, = node.plan_pods([PodSpec("echo-1", service_account="echo", labels={"app": "echo"}, app=ECHO)])
        RegistryFile(node.registry, yaml.safe_dump({
            "services": [{"name": "echo", "selector": {"app": "echo"},
                          "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}],
            "workloads": registry_workloads([echo_plan])}))
        node.start_istiod()
        echo = node.add_pod(echo_plan)
        node.wait_ready([echo], {"echo-1": 8080})

        assert echo.dir == runtime / "pods" / "echo-1"
        assert node.envoy_install in ("hard link", "copy")  # a copy when /run is another filesystem (tmpfs)
        assert node.proxy_config["binaryPath"] == str(runtime / "bin" / "envoy")
        pids = netns_pids(echo.netns)
        envoys = _named(pids, "envoy")
        assert len(envoys) == 1, pids
        assert _uid(envoys[0]) == PROXY_UID
        assert os.readlink(f"/proc/{envoys[0]}/exe") == str(runtime / "bin" / "envoy")
        assert os.readlink(f"/proc/{envoys[0]}/cwd") == str(echo.dir)  # the agent's working directory, the pod's
        assert (echo.dir / "var/run/secrets/workload-spiffe-uds/socket").is_socket()
        assert "inbound|8080||" in node.envoy_admin(echo, "config_dump?resource=dynamic_active_clusters")
        assert node.istiod is not None
        pids.append(node.istiod.pid)
    finally:
        node.close()
    assert not runtime.exists()
    assert not [pid for pid in pids if pid_alive(pid)]
    assert not {name for name in netns_names() if name.startswith(node.plan.prefix)}
    assert host_links() == links_before
    assert _mounts_under(runtime, private_dir) == []
    assert envoy.exists()  # the source is the user's: never touched
    # What stays is the user's, in the work directory: istiod-local's state, the registry, the logs.
    assert sorted(p.name for p in (checkout / "run" / "node").iterdir()) == ["istiod", "logs", "mesh.yaml"]


def test_sweep_stale_runs_removes_a_dead_owners_runtime_directory_from_the_real_root() -> None:
    need_root()
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = NodeRuntime(NodeOptions().runtime_root, gone.pid, 0)
    dead.create()
    try:
        (dead.pod_root / "echo-1").mkdir()
        sweep_stale_runs()  # (another test run on this machine may sweep it first: same end state)
        assert not dead.path.exists()
    finally:
        dead.remove()
