"""`istiod-local up --control-plane istiod --check`: the default mesh (examples/mesh.yaml) served by upstream's real
istiod beside istiod-local, every expectation held: sidecars, the proxyless pair, STRICT and PERMISSIVE
namespaces, the service entry, the pod outside the mesh (root, real pods, Envoys, capture and CNI chain).

And the switch's own refusals: it needs `--capture cni` (istiod reads the pods from istiod-local's Kubernetes
API) and upstream's `pilot-discovery`.
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

MESH = ROOT / "examples" / "mesh.yaml"


def _up(*args: str, env: dict[str, str] | None = None, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    istiod_local = str(Path(sys.executable).parent / "istiod-local")
    return subprocess.run([istiod_local, "up", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env, check=False)


def test_check_on_the_default_mesh_holds_every_expectation_with_the_real_istiod() -> None:
    need_root()
    for tool in ("ip", "setpriv", "iptables", "unshare", "mount"):
        need_tool(tool)
    need_upstream_commands("pilot-discovery")
    with open_workdir("ia-up-istiod-") as work:
        done = _up(str(MESH), "--control-plane", "istiod", "--check", "--plain", "--dir", str(work / "run"))
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any("the real istiod (pilot-discovery) on 10.244.0.1:15112" in line for line in lines), lines[:20]
    header = next(line for line in lines if line.startswith("client "))
    rows = [line for line in lines[lines.index(header) + 1:] if not line.endswith("expectations held")
            and not line.startswith("{") and not line.startswith("removed ")]
    assert rows and all(row.endswith(" ok") for row in rows), "\n".join(r for r in rows if not r.endswith(" ok"))
    proxyless = next(r for r in rows if r.startswith("greeter-client-1 "))
    assert proxyless.count("mtls spiffe://cluster.local/ns/default/sa/greeter-client") == 2, proxyless
    result = json.loads(lines[-1])
    assert result["pods"] == 9 and result["check_passed"] is True, result


def test_the_switch_needs_the_cni_node_and_pilot_discovery(tmp_path: Path) -> None:
    need_root()
    init = _up(str(MESH), "--control-plane", "istiod", "--capture", "init", "--once", "--dir", str(tmp_path / "a"))
    assert init.returncode == 2 and "--capture cni" in init.stderr, init.stderr
    env = {**os.environ, UPSTREAM_BIN_ENV: str(tmp_path / "nothing-here")}
    missing = _up(str(MESH), "--control-plane", "istiod", "--once", "--dir", str(tmp_path / "b"), env=env)
    assert missing.returncode == 2 and "pilot-discovery" in missing.stderr, missing.stderr
