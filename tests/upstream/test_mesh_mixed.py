"""A mixed mesh: `istiod-local up examples/mesh-mixed.yaml --check`, half the deployments on upstream's Go
pilot-agent and half on ours, every expectation held (root, real pods, Envoys, capture and CNI chain).

Without upstream's agent installed the same file is refused before anything is built, naming the deployments
that ask for it and what is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from needs import need_root, need_tool, need_upstream_commands
from support import ROOT, open_workdir

from istiod_local.node.upstream import UPSTREAM_BIN_ENV

pytestmark = pytest.mark.root

MIXED = ROOT / "examples" / "mesh-mixed.yaml"
UPSTREAM_PODS = ("frontend-1", "reviews-v2-1", "tcp-echo-1", "greeter-1")


def _up(*args: str, env: dict[str, str] | None = None, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    istiod_local = str(Path(sys.executable).parent / "istiod-local")
    return subprocess.run([istiod_local, "up", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env, check=False)


def test_check_on_the_mixed_mesh_holds_every_expectation_across_both_agents() -> None:
    need_root()
    for tool in ("ip", "setpriv", "iptables", "unshare", "mount"):
        need_tool(tool)
    need_upstream_commands("pilot-agent")
    with open_workdir("ia-mesh-mixed-") as work:
        done = _up(str(MIXED), "--check", "--dir", str(work / "run"))
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.startswith("client "))
    assert header.split() == ["client", "target", "via", "agents", "expected", "observed", "ok"]
    rows = [line for line in lines[lines.index(header) + 1:] if not line.endswith("expectations held")
            and not line.startswith("{")]
    assert rows and all(row.endswith(" ok") for row in rows), "\n".join(r for r in rows if not r.endswith(" ok"))
    # every direction between the two implementations was probed, with the client's identity verified by the server
    for client, target, agents in (("sleep-1", "frontend.default.svc.cluster.local:80", "istio-agent→upstream"),
                                   ("frontend-1", "ratings.secure.svc.cluster.local:9080", "upstream→istio-agent"),
                                   ("greeter-client-1", "greeter.default.svc.cluster.local:7070",
                                    "istio-agent→upstream")):
        row = next(r for r in rows if r.startswith(f"{client} ") and f" {target} " in r)
        assert f" {agents} " in row and row.count(f"/sa/{client[:-2]}") == 2, row
    # the start-up log says which pods run upstream's agent
    for pod in UPSTREAM_PODS:
        assert any(f"/{pod} ready:" in line and line.endswith("(upstream's agent)") for line in lines), pod
    result = json.loads(lines[-1])
    assert result["pods"] == 9 and result["check_passed"] is True, result


def test_the_mixed_mesh_is_refused_without_upstreams_agent_and_nothing_is_built(tmp_path: Path) -> None:
    need_root()
    env = {**os.environ, UPSTREAM_BIN_ENV: str(tmp_path / "bin")}
    done = _up(str(MIXED), "--check", "--dir", str(tmp_path / "run"), env=env, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "frontend, reviews-v2, tcp-echo, greeter ask for agent: upstream" in done.stderr, done.stderr
    assert f"not installed in {tmp_path / 'bin'}" in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()
