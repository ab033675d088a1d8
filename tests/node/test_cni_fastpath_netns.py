"""The istio-cni fast path applying rules for real (root): install-cni's worker thread enters the pod's netns,
applies exactly what the in-process plugin applies there, and leaves install-cni itself where it was.

Two pod namespaces per case (`iacni-fpa-*` through the launcher and the fast path, `iacni-fpb-*` through
the console script in-process), each IPv6-only behind a veth to a peer namespace: the node reads IPv4
first, so a host fact read in the wrong namespace would give the fast path's pod IPv4 rules where the
in-process pod gets IPv6 ones. The rules each holds are read back with the `*-save` tools and `nft`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cni_fastpath_peers import CONSOLE_SCRIPT, FastPathAgent, cni_env, run_plugin
from cni_peers import PodApi
from needs import need_root, need_tool


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=60)


def sidecar_pod(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "shop", "labels": {},
                         "annotations": {"sidecar.istio.io/status": "{}", **(annotations or {})}},
            "spec": {"containers": [{"name": "app"}, {"name": "istio-proxy", "args": ["proxy", "sidecar"]}]}}


class PodNs:
    """An IPv6-only pod namespace with a veth to its peer."""

    def __init__(self, kind: str) -> None:
        tag = uuid.uuid4().hex[:8]
        self.name, self.peer = f"iacni-fp{kind}-{tag}", f"iacni-fpp-{tag}"
        sh("ip", "netns", "add", self.name)
        sh("ip", "netns", "add", self.peer)
        sh("ip", "-n", self.name, "link", "set", "lo", "up")
        sh("ip", "-n", self.name, "link", "add", "eth0", "type", "veth", "peer", "name", "v1", "netns", self.peer)
        sh("ip", "-n", self.name, "addr", "add", "fd78::2/64", "dev", "eth0", "nodad")
        sh("ip", "-n", self.peer, "addr", "add", "fd78::1/64", "dev", "v1", "nodad")
        sh("ip", "-n", self.name, "link", "set", "eth0", "up")
        sh("ip", "-n", self.peer, "link", "set", "v1", "up")

    @property
    def path(self) -> str:
        return f"/run/netns/{self.name}"

    def rules(self) -> str:
        lines = []
        for tool in ("iptables-save", "ip6tables-save"):
            out = sh("ip", "netns", "exec", self.name, tool, check=False).stdout
            lines += [f"{tool}: {line}" for line in out.splitlines() if line.startswith("-A ")]
        return "\n".join(lines)

    def nft(self) -> str:
        return sh("ip", "netns", "exec", self.name, "nft", "list", "ruleset").stdout

    def lo_addresses(self) -> str:
        return sh("ip", "-n", self.name, "-6", "addr", "show", "dev", "lo").stdout

    def destroy(self) -> None:
        for ns in (self.name, self.peer):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)


@pytest.fixture(scope="module")
def api() -> Iterator[PodApi]:
    folder = Path(tempfile.mkdtemp(prefix="iacni-api-"))
    server = PodApi(folder)
    server.add_pod(sidecar_pod("web"))
    server.add_pod(sidecar_pod("evil", {"traffic.sidecar.istio.io/excludeInterfaces": "eth0 -j ACCEPT"}))
    yield server
    server.close()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def agent(api: PodApi) -> Iterator[FastPathAgent]:
    need_root()
    for tool in ("ip", "iptables-save", "ip6tables-save", "nft"):
        need_tool(tool)
    instance = FastPathAgent(api)
    try:
        yield instance.start()
    finally:
        instance.stop()


@pytest.fixture
def pods() -> Iterator[tuple[PodNs, PodNs]]:
    made: list[PodNs] = []
    try:
        made.append(PodNs("a"))
        made.append(PodNs("b"))
        yield made[0], made[1]
    finally:
        for ns in made:
            ns.destroy()


def netns_of_threads(pid: int) -> set[tuple[int, int]]:
    found = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            info = os.stat(f"/proc/{pid}/task/{task}/ns/net")
        except FileNotFoundError:
            continue
        found.add((info.st_dev, info.st_ino))
    return found


def host_tables() -> str:
    """The node's iptables and ip6tables state, without the `# Generated ... on <time>` comments."""
    saved = sh("iptables-save").stdout + sh("ip6tables-save").stdout
    return "\n".join(line for line in saved.splitlines() if not line.startswith("#"))


def add_both(agent: FastPathAgent, pods: tuple[PodNs, PodNs], pod_name: str,
             **fields: Any) -> subprocess.CompletedProcess[bytes]:
    fast_ns, slow_ns = pods
    before = agent.fast_path_answers()
    config = agent.config(prevResult={"cniVersion": "1.0.0", "ips": [{"address": "fd78::2/64", "interface": 0}]},
                          **fields)
    fast = run_plugin(agent.launcher, cni_env(pod_name=pod_name, netns=fast_ns.path), config)
    slow = run_plugin(CONSOLE_SCRIPT, cni_env(pod_name=pod_name, netns=slow_ns.path), config)
    assert (fast.returncode, fast.stdout) == (slow.returncode, slow.stdout), (fast, slow)
    assert agent.answers_reach(before + 1) == before + 1, agent.output()[-3000:]
    return fast


def test_a_sidecar_pod_gets_the_same_rules_through_the_fast_path(agent: FastPathAgent,
                                                                 pods: tuple[PodNs, PodNs]) -> None:
    host = os.stat("/proc/self/ns/net")
    host_rules = host_tables()
    assert agent.proc is not None
    done = add_both(agent, pods, "web")
    assert done.returncode == 0, done.stderr
    fast_ns, slow_ns = pods
    rules = fast_ns.rules()
    assert "ip6tables-save: -A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001" in rules  # read in the pod netns
    assert rules == slow_ns.rules()
    assert "::6/128" in fast_ns.lo_addresses() and "::6/128" in slow_ns.lo_addresses()
    # install-cni is where it was: every thread in the node's netns, the node's tables as before.
    assert netns_of_threads(agent.proc.pid) == {(host.st_dev, host.st_ino)}
    assert host_tables() == host_rules
    # The kept-alive GET still works from the node's netns for the next pod (the call thread was discarded).
    for command in ("CHECK", "DEL"):
        assert run_plugin(agent.launcher, cni_env(command, pod_name="web", netns=fast_ns.path),
                          agent.config()).returncode == 0


def test_native_nftables_through_the_fast_path(agent: FastPathAgent, pods: tuple[PodNs, PodNs]) -> None:
    done = add_both(agent, pods, "web", native_nftables=True)
    assert done.returncode == 0, done.stderr
    fast_ns, slow_ns = pods
    ruleset = fast_ns.nft()
    assert "table ip6 istio-proxy-nat" in ruleset and ruleset == slow_ns.nft()
    assert fast_ns.rules() == ""


def test_the_injection_annotation_applies_nothing_through_the_fast_path(agent: FastPathAgent,
                                                                        pods: tuple[PodNs, PodNs]) -> None:
    done = add_both(agent, pods, "evil")
    assert done.returncode == 1 and b"traffic.sidecar.istio.io/excludeInterfaces" in done.stdout
    fast_ns, _ = pods
    assert fast_ns.rules() == "" and "istio" not in fast_ns.nft()
