"""A WasmPlugin applied to upstream's real istiod reaches Envoy through our agent.

The default mesh's WasmPlugin YAML, as it is (examples/wasm/add-header.yaml, a Proxy-Wasm module
`istiod-local up` builds from WAT and serves from the node), on a small mesh run in this process with
`--control-plane istiod`: istiod sends ratings' Envoy an extension config whose code is the module's URL, our
agent fetches the module and hands Envoy the local file, and a request through the sidecars carries the
plugin's header. No Envoy rejected anything (`update_rejected`), istiod saw every type ACKed, the agent
counted one fetch and its conversion. Then the plugin is taken out of the mesh file while it runs: the header
goes (istiod's own config and the registry's translation both drop it) and still nothing is rejected.
(`test_up_real_istiod.py` checks the default mesh, header included, with `--check`.)
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from needs import need_root, need_tool, need_upstream_commands
from support import ROOT, open_workdir, poll

from istiod_local.mesh.planner import APPS_MODULE
from istiod_local.mesh.runner import EventLog, MeshRun, UpOptions

pytestmark = pytest.mark.root

MESH = """\
namespaces:
- {name: default, peerAuthentication: PERMISSIVE}
- {name: secure, peerAuthentication: STRICT}
services:
- name: ratings
  namespace: secure
  ports: [{name: http, port: 9080, targetPort: 8080, protocol: HTTP}]
deployments:
- name: sleep
  dnsCapture: true
  app: {kind: client, calls: [ratings.secure:9080]}
- name: ratings
  namespace: secure
  app: {kind: http-echo, port: 8080}
"""
WASM = "istioConfig: [wasm/add-header.yaml]\nwasmModules: [wasm/add-header.wat]\n"
RATINGS = "http://ratings.secure.svc.cluster.local:9080/"
EXTENSION = "extensions.istio.io/trafficextension/secure.add-header~istio-translated-wasmplugin"


@pytest.fixture
def mesh() -> Iterator[tuple[MeshRun, Path, io.StringIO]]:
    need_root()
    for tool in ("ip", "setpriv", "iptables", "unshare", "mount", "curl", "wat2wasm"):
        need_tool(tool)
    need_upstream_commands("pilot-discovery")
    with open_workdir("ia-wasm-istiod-") as work:
        shutil.copytree(ROOT / "examples" / "wasm", work / "wasm")
        (work / "mesh.yaml").write_text(MESH + WASM)
        events = io.StringIO()
        run = MeshRun(UpOptions(work / "mesh.yaml", work / "run", control_plane="istiod"), EventLog(events))
        try:
            run.start()
            yield run, work, events
        finally:
            run.close()


def _get(run: MeshRun, pod: str, url: str) -> dict[str, Any]:
    """One GET from the pod (its own traffic, through its sidecar): the probe's answer, response headers too."""
    assert run.node is not None
    argv = [sys.executable, "-m", APPS_MODULE, "probe", json.dumps([{"kind": "http", "address": url}])]
    done = subprocess.run(run.node.in_pod(run.pods[pod], argv), capture_output=True, text=True, timeout=60)
    answer: dict[str, Any] = json.loads(done.stdout)[0]
    return answer


def _no_rejection(run: MeshRun) -> None:
    """No Envoy rejected an update, and istiod saw each type it sent ACKed."""
    node = run.node
    assert node is not None and node.real_istiod is not None
    for name, pod in run.pods.items():
        stats = node.envoy_admin(pod, "stats?filter=update_rejected")
        counters = dict(line.rsplit(": ", 1) for line in stats.splitlines() if ": " in line)
        assert counters and all(v == "0" for v in counters.values()), (name, counters)
    done = subprocess.run(["ip", "netns", "exec", node.plan.netns, "curl", "-sf", "--max-time", "10",
                           f"http://{node.real_istiod.plan.http_address}/debug/syncz"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    for entry in json.loads(done.stdout):
        for type_url, status in (entry.get("resources") or {}).items():
            assert status.get("acked") == status.get("sent") and not status.get("lastError"), (type_url, entry)


def _wasm_metrics(run: MeshRun, pod: str) -> dict[str, float]:
    assert run.node is not None
    text = run.node.exec(run.pods[pod], ["curl", "-sf", "http://127.0.0.1:15020/stats/prometheus"]).stdout
    found = re.findall(r'^(istio_agent_wasm_\w+(?:\{[^}]*\})?) ([0-9.e+-]+)$', text, re.MULTILINE)
    return {name: float(value) for name, value in found}


def test_the_plugin_reaches_envoy_through_our_agent_and_goes_when_taken_out(
        mesh: tuple[MeshRun, Path, io.StringIO]) -> None:
    run, work, events = mesh
    assert "Istio config given to the real istiod: 1 WasmPlugin" in events.getvalue(), events.getvalue()
    answer = _get(run, "sleep-1", RATINGS)
    assert answer["status"] == 200 and answer["headers"].get("x-wasm-plugin") == "add-header", answer
    assert run.node is not None
    dump = json.loads(run.node.envoy_admin(run.pods["ratings-1"], "config_dump?resource=ecds_filters"))
    (config,) = [c["ecds_filter"] for c in dump["configs"]]
    assert config["name"] == EXTENSION, config
    code = config["typed_config"]["config"]["vm_config"]["code"]
    assert "local" in code and "remote" not in code, code  # the agent's rewrite: a file in its cache
    metrics = _wasm_metrics(run, "ratings-1")
    assert metrics['istio_agent_wasm_remote_fetch_count{result="success"}'] == 1, metrics
    assert metrics['istio_agent_wasm_config_conversion_count{result="success"}'] >= 1, metrics
    _no_rejection(run)

    # Taken out while the mesh runs: istiod drops the filter, the answers lose the header.
    (work / "mesh.yaml").write_text(MESH)

    def gone() -> bool:
        run.poll_mesh_file()
        answer = _get(run, "sleep-1", RATINGS)
        return answer.get("status") == 200 and "x-wasm-plugin" not in answer["headers"]

    poll(gone, "the plugin to be gone", 30, events.getvalue, interval=0.2)
    _no_rejection(run)
