"""Upstream's Go install-cni (and the Go istio-cni plugin it installs) as the local node's CNI agent, and ours,
against the same pods (root, network namespaces, the CNI chain, real Envoys).

Two nodes, one after the other, with the same pods at the same addresses: the first with
`NodeOptions(cni="upstream")`, the second with ours. Each pod's capture as `iptables-save` prints it is
taken from both; after dropping the comment lines and the packet counters they must be identical. The
pods on upstream's CNI pass istio-validation, are ready and talk mTLS; upstream's install-cni chained its
plugin into the node's network and its SIGTERM cleanup gave the network back as it found it.

Pods: `echo-1` (the echo app behind `echo`), `sleep-1` (DNS capture), `tuned-1` (the injector's capture
annotations), `go-1` (upstream's Go agent: all of upstream's side at once), `plain-1` (outside the mesh).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from launchers import RegistryFile, local_node
from needs import need_root, need_tool, need_upstream_commands

from istiod_local.node.demo import CLIENT_SPIFFE, ECHO_SERVICE, ECHO_SPIFFE, registry_yaml, request
from istiod_local.node.plan import PodSpec
from istiod_local.node.upstream import UPSTREAM, UPSTREAM_BIN_ENV

pytestmark = pytest.mark.root

PY = sys.executable
ECHO_APP = [PY, "-m", "istiod_local.node.echo_app", "serve", "--port", "8080"]
TUNED = {"traffic.sidecar.istio.io/excludeOutboundPorts": "5432",
         "traffic.sidecar.istio.io/includeInboundPorts": "8080",
         "traffic.sidecar.istio.io/excludeOutboundIPRanges": "10.96.0.99/32",
         "traffic.sidecar.istio.io/excludeInboundPorts": "9901"}
CAPTURED = ("echo-1", "sleep-1", "tuned-1", "go-1")


def _pods() -> list[PodSpec]:
    return [
        PodSpec("echo-1", service_account="echo", labels={"app": "echo"}, app=ECHO_APP, ip="10.244.0.10"),
        PodSpec("sleep-1", service_account="sleep", labels={"app": "sleep"}, dns_capture=True, ip="10.244.0.11"),
        PodSpec("tuned-1", service_account="tuned", labels={"app": "tuned"}, annotations=TUNED, ip="10.244.0.12"),
        PodSpec("go-1", service_account="go", labels={"app": "go"}, dns_capture=True, ip="10.244.0.13",
                agent_implementation=UPSTREAM),
        PodSpec("plain-1", service_account="plain", sidecar=False, ip="10.244.0.14"),
    ]


@dataclass
class NodeRun:
    """What one node showed, taken before it was closed (and what its CNI agent left when it stopped)."""

    rules: dict[str, str] = field(default_factory=dict)
    validation: dict[str, list[int]] = field(default_factory=dict)
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    chain: list[str] = field(default_factory=list)
    plugin_size: int = 0
    conflist_written: bytes = b""
    conflist_at_stop: bytes = b""
    plugin_left_at_stop: bool = True
    agent_exit: int | None = None


def _run(cni: str) -> NodeRun:
    out = NodeRun()
    with local_node(f"ia-cni-{cni}-", ready_timeout=60, capture="cni", cni=cni) as node:
        plans = node.plan_pods(_pods())
        RegistryFile(node.registry).write(registry_yaml(plans, [ECHO_SERVICE], "STRICT"))
        node.start_istiod()
        pods = {pod.name: pod for pod in node.add_pods(plans)}
        node.wait_ready(pods.values(), {"echo-1": 8080})
        assert node.cni is not None
        out.chain = [p["type"] for p in json.loads(node.cni.paths.conflist.read_text())["plugins"]]
        out.plugin_size = (node.cni.paths.bin_dir / "istio-cni").stat().st_size
        for name, pod in pods.items():
            out.rules[name] = node.exec(pod, ["iptables-save"]).stdout
            out.validation[name] = pod.validation
        for client in ("sleep-1", "go-1"):
            out.answers[client] = request(node, pods[client], "http://echo/", time.monotonic() + 30)
        cni_side = node.cni
    out.conflist_written, out.conflist_at_stop = cni_side.conflist_written, cni_side.conflist_at_stop
    out.plugin_left_at_stop, out.agent_exit = cni_side.plugin_left_at_stop, cni_side.agent_exit
    return out


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, NodeRun]]:
    need_root()
    for tool in ("ip", "setpriv", "unshare", "mount", "iptables-save"):
        need_tool(tool)
    need_upstream_commands("install-cni", "istio-cni", "pilot-agent")
    yield {cni: _run(cni) for cni in (UPSTREAM, "istio-agent")}


def normalised(rules: str) -> str:
    """iptables-save without its comment lines (version, date) and with every counter zeroed."""
    lines = [line for line in rules.splitlines() if not line.startswith("#")]
    return "\n".join(re.sub(r"\[\d+:\d+\]", "[0:0]", line) for line in lines)


def test_upstreams_install_cni_chained_its_own_plugin_into_the_nodes_network(runs: dict[str, NodeRun]) -> None:
    ours, theirs = runs["istio-agent"], runs[UPSTREAM]
    assert theirs.chain == ours.chain == ["bridge", "istio-cni"]
    upstream = need_upstream_commands("istio-cni")
    assert theirs.plugin_size == upstream.istio_cni.stat().st_size  # the Go plugin, not our launcher
    assert ours.plugin_size != theirs.plugin_size


@pytest.mark.parametrize("pod", [*CAPTURED, "plain-1"])
def test_both_plugins_capture_each_pod_the_same_way(runs: dict[str, NodeRun], pod: str) -> None:
    theirs, ours = normalised(runs[UPSTREAM].rules[pod]), normalised(runs["istio-agent"].rules[pod])
    if pod == "plain-1":
        assert "ISTIO_" not in theirs and "ISTIO_" not in ours
        return
    assert "-A ISTIO_INBOUND" in theirs and "-j ISTIO_REDIRECT" in theirs, theirs
    assert theirs == ours


def test_the_capture_follows_the_annotations_and_dns_capture(runs: dict[str, NodeRun]) -> None:
    rules = normalised(runs[UPSTREAM].rules["tuned-1"])
    assert "--dport 8080 -j ISTIO_IN_REDIRECT" in rules and "--dport 5432 -j RETURN" in rules, rules
    assert "-d 10.96.0.99/32 -j RETURN" in rules, rules
    assert "15053" in normalised(runs[UPSTREAM].rules["sleep-1"]) and "15053" not in rules


def test_pods_on_upstreams_cni_pass_validation_and_talk_mtls(runs: dict[str, NodeRun]) -> None:
    run = runs[UPSTREAM]
    assert all(run.validation[name] == [0] for name in CAPTURED), run.validation
    for client, identity in (("sleep-1", CLIENT_SPIFFE), ("go-1", "spiffe://cluster.local/ns/default/sa/go")):
        xfcc = run.answers[client]["body"]["headers"]["x-forwarded-client-cert"]
        assert f"By={ECHO_SPIFFE};" in xfcc and xfcc.endswith(f"URI={identity}"), xfcc


def test_upstreams_install_cni_cleaned_up_on_sigterm(runs: dict[str, NodeRun]) -> None:
    run = runs[UPSTREAM]
    assert run.agent_exit == 0
    assert json.loads(run.conflist_at_stop) == json.loads(run.conflist_written)
    assert not run.plugin_left_at_stop


def test_up_refuses_upstreams_cni_when_it_is_not_installed(tmp_path: Path) -> None:
    need_root()
    env = {**os.environ, UPSTREAM_BIN_ENV: str(tmp_path / "bin")}
    done = subprocess.run([str(Path(sys.executable).parent / "istiod-local"), "up", "--cni", "upstream", "--once",
                           "--dir", str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=60,
                          check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"--cni upstream: upstream's Go install-cni, istio-cni not installed in {tmp_path / 'bin'}" in done.stderr
    assert not (tmp_path / "run").exists()
