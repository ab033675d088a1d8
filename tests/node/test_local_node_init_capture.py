"""The local node in init-container capture mode (root), in the default run: `NodeOptions(capture="init")`
wires a sidecar pod as the `istio-init` container would (istio-iptables in the pod's namespace, its output in
`<workdir>/logs/<pod>-init.log`), with no CNI chain and no install-cni on the node.

The CNI mode (the node's default) is tests/node/test_local_node_cni.py; the whole node suite runs in this mode
with ISTIO_AGENT_TEST_NODE_CAPTURE=init.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from launchers import local_node
from needs import need_root, need_tool

from istiod_local.node.plan import PodSpec
from istiod_local.node.processes import netns_pids


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_init_mode_captures_through_istio_init_without_install_cni() -> None:
    need_root()
    for tool in ("ip", "iptables-save"):
        need_tool(tool)
    with local_node("iainit-node-", ready_timeout=30, capture="init") as node:
        assert node.options.capture == "init" and node.cni is None
        pod = node.add_pod(PodSpec("cap-1", agent=False))
        init_log = node.logs / "cap-1-init.log"
        assert init_log.is_file(), "istio-init (istio-iptables) did not run for the pod"
        logged = init_log.read_text(errors="replace")
        assert logged.startswith("istio-iptables: applied ")  # its report of the rules it applied
        rules = subprocess.run(["ip", "netns", "exec", pod.netns, "iptables-save"], capture_output=True, text=True,
                               check=True).stdout
        assert "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001" in rules
        assert "-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006" in rules
        assert pod.validation == []  # no istio-validation: istio-init itself applied the rules
        # No CNI on this node: no install-cni process in its namespace or log, no plugin log line.
        assert not [pid for pid in netns_pids(node.plan.netns) if "install-cni" in _cmdline(pid)]
        assert not (node.logs / "install-cni.log").exists()
