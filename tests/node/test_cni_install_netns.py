"""install-cni with upstream's fixed ports (:8000 health, :15014 metrics) in a fresh network namespace (root).

The component tests move the health port (`--readiness-port`, ours) so a busy :8000 on a dev
machine does not matter; here the defaults are used, as on a node, inside a namespace of our own
(`iacni-<id>`, loopback up), and the checks run from a child in the same namespace.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from needs import need_root, need_tool
from support import VENV_BIN, LineCollector, loopback_netns, poll, stop_process

PROBE = r"""
import http.client, sys
out = []
for port, path in ((8000, "/healthz"), (8000, "/readyz"), (15014, "/metrics")):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=2); c.request("GET", path)
        r = c.getresponse(); body = r.read().decode(); out.append(f"{port}{path} {r.status}")
        if path == "/metrics": out.append(str("istio_cni_install_ready 1.0" in body))
    except OSError as e:
        out.append(f"{port}{path} {type(e).__name__}")
print(" ".join(out))
"""


@pytest.fixture
def netns() -> Iterator[str]:
    need_root()
    need_tool("ip")
    with loopback_netns("iacni-") as name:
        yield name


def test_default_ports_in_a_node_namespace(netns: str, tmp_path: Path) -> None:
    ip = need_tool("ip")
    for folder in ("net.d", "bin", "run", "sa"):
        (tmp_path / folder).mkdir()
    (tmp_path / "sa" / "token").write_text("token")
    (tmp_path / "sa" / "ca.crt").write_text("ca")
    (tmp_path / "net.d" / "10-bridge.conflist").write_text(json.dumps(
        {"cniVersion": "1.0.0", "name": "node", "plugins": [{"type": "bridge"}]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "REPAIR_", "CNI_"))}
    env.update(KUBERNETES_SERVICE_HOST="127.0.0.1", KUBERNETES_SERVICE_PORT="6443")
    proc = subprocess.Popen(
        [ip, "netns", "exec", netns, str(VENV_BIN / "install-cni"), f"--mounted-cni-net-dir={tmp_path}/net.d",
         f"--cni-bin-dir={tmp_path}/bin", f"--cni-agent-run-dir={tmp_path}/run",
         f"--service-account-dir={tmp_path}/sa", "--repair-enabled=false"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = LineCollector(proc.stdout)
    try:
        def probe() -> str:
            return subprocess.run([ip, "netns", "exec", netns, sys.executable, "-c", PROBE], capture_output=True,
                                  text=True, timeout=20, check=False).stdout.strip()
        seen = poll(lambda: (out := probe()).startswith("8000/healthz 200 8000/readyz 200") and out, "ready on :8000",
                    20, log.text)
        assert seen == "8000/healthz 200 8000/readyz 200 15014/metrics 200 True"
    finally:
        stop_process(proc)
    assert proc.returncode == 0, log.text()
    assert not (tmp_path / "bin" / "istio-cni").exists()
