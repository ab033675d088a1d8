"""WasmPlugins through our agent to the real Envoy: fetched over HTTP and OCI, applied, changed, refused.

A pod network namespace with capture (as `test_sidecar_drain_load`): istiod-local, the echo app on 8080, a
plain HTTP module server and the distribution registry (both on the pod's loopback) and the agent with its
Envoy run in the pod (the unreachable registry is a closed loopback port: the agent and Envoy run as root
here, so their own traffic to another host would be captured). Requests come from the client namespace to
`<pod IP>:8080`, through Envoy's `virtualInbound`, where istiod-local puts the plugins' ECDS filters. The
modules are Proxy-Wasm modules assembled from WAT (`wasm_modules.py`): `header` adds x-wasm-config (its
plugin configuration) and x-wasm-version, `deny` answers 403 to /forbidden. The proof is what the client
gets, Envoy's config dump and the agent's metrics (`istio_agent_wasm_*`, as upstream names them).
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures import AgentStarter
from launchers import IstiodLocal, PilotAgent, RegistryFile, agent_environment, echo_registry
from sidecar_harness import Netns, netns_prefix
from support import poll, stop_process
from wasm_modules import deny_module, header_module, sha256
from wasm_registry import Registry

MODULE_PORT = 18080
MAX_MODULE = 64 * 1024  # ISTIO_WASM_MAX_BINARY_SIZE_BYTES for the agent: the oversized module is over it


@dataclass
class Pod:
    netns: Netns
    registry_file: RegistryFile
    base: dict[str, Any]
    modules: Path
    oci: Registry
    istiod: IstiodLocal
    agent: PilotAgent | None = None

    def request(self, path: str = "/") -> tuple[int, dict[str, str], str]:
        done = subprocess.run(["ip", "netns", "exec", self.netns.client, "curl", "-s", "-m", "3", "-D", "-",
                               f"http://{Netns.POD_IP}:8080{path}"], capture_output=True, text=True, timeout=10)
        head, _, body = done.stdout.partition("\n\n")  # text mode: curl's CRLFs read as newlines
        lines = head.split("\n")
        status = int(lines[0].split()[1]) if lines and lines[0].startswith("HTTP/") else 0
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        return status, headers, body

    def downloads(self, name: str) -> int:
        """How many times the module server answered GET /<name> (from its request log)."""
        return (self.modules.parent / "modules.log").read_text().count(f"GET /{name} ")

    def diagnose(self) -> str:
        """For a failure message: an answer, Envoy's extension configs and rejections, the agent's log."""
        status, dump = self.netns.http(self.netns.pod, "http://127.0.0.1:15000/config_dump?resource=ecds_filters")
        _, stats = self.netns.http(self.netns.pod, "http://127.0.0.1:15000/stats?filter=ecds|extension_config|wasm")
        agent = self.agent.output(80) if self.agent is not None else ""
        return f"answer: {self.request()}\necds ({status}): {dump[:3000]}\nstats: {stats}\n{agent}"

    def plugins(self, *plugins: dict[str, Any]) -> None:
        self.registry_file.write({**self.base, "wasmPlugins": list(plugins)})

    def metrics(self) -> dict[str, float]:
        status, text = self.netns.http(self.netns.pod, "http://127.0.0.1:15020/stats/prometheus")
        out: dict[str, float] = {"scrape_status": status}
        for line in text.splitlines():
            match = re.match(r'^(istio_agent_wasm_\w+)(\{[^}]*\})? ([0-9.e+-]+)$', line)
            if match:
                out[match.group(1) + (match.group(2) or "")] = float(match.group(3))
        return out


def header_plugin(url: str, **fields: Any) -> dict[str, Any]:
    return {"name": "header", "namespace": "default", "selector": {"app": "echo"}, "url": url, "phase": "STATS",
            **fields}


@pytest.fixture
def pod(tmp_path: Path, start_agent: AgentStarter) -> Iterator[Pod]:
    Netns.check_prerequisites()
    Registry.check_prerequisites()
    netns = Netns()
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "header-1.wasm").write_bytes(header_module("1"))
    (modules / "header-2.wasm").write_bytes(header_module("2"))
    (modules / "huge.wasm").write_bytes(header_module("1") + b"\x00" * (2 * MAX_MODULE))
    base = yaml.safe_load(echo_registry(workload_ip=Netns.POD_IP))
    registry_file = RegistryFile(tmp_path / "mesh.yaml", base)
    server = app = None
    server_log = (tmp_path / "modules.log").open("wb")
    try:
        netns.create()
        server = subprocess.Popen([*netns_prefix(netns.pod), "python3", "-m", "http.server", str(MODULE_PORT),
                                   "--bind", "127.0.0.1", "--directory", str(modules)],
                                  stdout=subprocess.DEVNULL, stderr=server_log)
        poll(lambda: netns.http(netns.pod, f"http://127.0.0.1:{MODULE_PORT}/")[0] == 200,
             "the module server", 20)
        app = netns.exec_python(netns.pod, "app", "8080", stdin=subprocess.PIPE)
        assert app.stdout is not None and app.stdout.readline().strip() == "READY"
        with Registry(tmp_path / "oci", inside=netns.pod) as oci, \
                IstiodLocal(tmp_path / "state", registry=registry_file, prefix=netns_prefix(netns.pod)) as istiod:
            yield Pod(netns, registry_file, base, modules, oci, istiod)
    finally:
        for proc in (app, server):
            stop_process(proc, grace=2)
        if app is not None:
            for stream in (app.stdin, app.stdout, app.stderr):
                if stream is not None:
                    stream.close()
        netns.destroy()
        server_log.close()


def start(pod: Pod, start_agent: AgentStarter, tmp_path: Path) -> PilotAgent:
    pod_dir = pod.istiod.pod_files(tmp_path / "pod", pod="echo-1")
    agent = start_agent(pod_dir, agent_environment(
        discovery=pod.istiod.secure_address, instance_ip=Netns.POD_IP, proxy_config={"terminationDrainDuration": "1s"},
        ISTIO_WASM_MAX_BINARY_SIZE_BYTES=str(MAX_MODULE), WASM_HTTP_REQUEST_MAX_RETRIES="1"),
        prefix=netns_prefix(pod.netns.pod))
    poll(lambda: pod.netns.http(pod.netns.pod, "http://127.0.0.1:15021/healthz/ready")[0] == 200,
         "the agent in the pod to be ready", 40, agent.output)
    pod.agent = agent
    return agent


def test_wasm_plugins_over_http_and_oci_applied_changed_refused_and_cached(
        pod: Pod, start_agent: AgentStarter, tmp_path: Path) -> None:
    v1 = f"http://127.0.0.1:{MODULE_PORT}/header-1.wasm"
    deny_digest = pod.oci.push_image(deny_module(), "wasm/deny", "v1", docker=True)
    deny = {"name": "deny", "namespace": "default", "selector": {"app": "echo"}, "phase": "AUTHZ",
            "url": f"oci://{pod.oci.address}/wasm/deny:v1", "sha256": deny_digest}
    pod.plugins(header_plugin(v1, sha256=sha256(header_module("1")), pluginConfig={"tag": "one"}), deny)
    agent = start(pod, start_agent, tmp_path)

    def answer(path: str = "/") -> tuple[int, dict[str, str], str]:
        return pod.request(path)

    poll(lambda: answer()[1].get("x-wasm-version") == "1", "the header plugin on the inbound listener", 30,
         pod.diagnose)
    status, headers, _ = answer()
    assert status == 200 and headers["x-wasm-config"] == '{"tag":"one"}'
    status, _, body = answer("/forbidden")
    assert (status, body) == (403, "denied by wasm"), "the OCI plugin answers /forbidden"

    # The plugin's configuration, then its module, change: both reach Envoy.
    pod.plugins(header_plugin(v1, pluginConfig={"tag": "two"}), deny)
    poll(lambda: answer()[1].get("x-wasm-config") == '{"tag":"two"}', "the new plugin configuration", 30)
    v2 = f"http://127.0.0.1:{MODULE_PORT}/header-2.wasm"
    pod.plugins(header_plugin(v2, sha256=sha256(header_module("2")), pluginConfig={"tag": "two"}), deny)
    poll(lambda: answer()[1].get("x-wasm-version") == "2", "the new module version", 30)
    assert answer("/forbidden")[0] == 403
    fetched = pod.metrics()
    assert fetched['istio_agent_wasm_remote_fetch_count{result="success"}'] == 3

    # Four plugins that cannot be had: each refused with its reason, fail-open, and the listener keeps serving.
    broken = [
        header_plugin(v2, name="mismatch", sha256="0" * 64, failStrategy="FAIL_OPEN"),
        header_plugin("oci://127.0.0.1:5999/wasm/none:v1", name="unreachable", failStrategy="FAIL_OPEN"),
        header_plugin("http://169.254.169.254/latest/plugin.wasm", name="metadata", failStrategy="FAIL_OPEN"),
        header_plugin(f"http://127.0.0.1:{MODULE_PORT}/huge.wasm", name="oversized", failStrategy="FAIL_OPEN"),
    ]
    pod.plugins(header_plugin(v2, sha256=sha256(header_module("2")), pluginConfig={"tag": "two"}), deny, *broken)
    poll(lambda: pod.metrics().get('istio_agent_wasm_config_conversion_count{result="fetch_failure"}', 0) >= 4,
         "the four failures to be counted", 60, pod.diagnose)
    metrics = pod.metrics()
    assert metrics['istio_agent_wasm_remote_fetch_count{result="checksum_mismatched"}'] >= 1
    assert metrics['istio_agent_wasm_remote_fetch_count{result="manifest_failure"}'] >= 1
    assert metrics['istio_agent_wasm_remote_fetch_count{result="download_failure"}'] >= 2
    log = agent.output(400)
    assert f"has checksum {sha256(header_module('2'))}, which does not match: {'0' * 64}" in log
    assert "is link-local" in log and "larger than the limit" in log and "could not fetch Wasm OCI image" in log
    status, headers, _ = answer()
    assert status == 200 and headers.get("x-wasm-version") == "2", "the listener keeps serving, fail-open"

    # A restart: the modules come from the cache on disk (no fetch); with Always and a new version, fetched.
    downloads = pod.downloads("header-2.wasm")
    agent.signal(signal.SIGTERM)
    assert agent.wait_exit(20) == 0, agent.output()
    pod.plugins(header_plugin(v2, sha256=sha256(header_module("2")), pluginConfig={"tag": "two"}), deny)
    agent = start(pod, start_agent, tmp_path)
    poll(lambda: answer()[1].get("x-wasm-version") == "2", "the plugin after the restart", 30, agent.output)
    assert answer("/forbidden")[0] == 403
    metrics = pod.metrics()
    assert metrics.get('istio_agent_wasm_remote_fetch_count{result="success"}', 0) == 0, metrics
    assert metrics['istio_agent_wasm_cache_lookup_count{hit="true"}'] >= 2
    assert pod.downloads("header-2.wasm") == downloads, "IfNotPresent after a restart: no download"
    pod.plugins(header_plugin(v2, imagePullPolicy="Always", pluginConfig={"tag": "three"}), deny)
    poll(lambda: answer()[1].get("x-wasm-config") == '{"tag":"three"}', "the Always plugin", 30)
    # Downloaded again; the same bytes are the module already cached (upstream counts no new fetch then).
    assert pod.downloads("header-2.wasm") == downloads + 1
