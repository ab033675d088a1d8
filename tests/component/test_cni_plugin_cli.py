"""The installed `istio-cni` script as a CNI runtime execs it: protocol, pod lookup over HTTPS, log socket.

Every test runs the real console script with a CNI environment and a network
config on stdin, against real peers on loopback (`cni_peers`: an HTTPS pod API
with bearer tokens, the node agent's log socket). ADDs that would program a
pod run with DRY_RUN_FILE_PATH, so nothing here needs root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cni_peers import LogSocket, PodApi, closed_port, write_kubeconfig
from needs import need
from support import VENV_BIN

SCRIPT = VENV_BIN / "istio-cni"
SIDECAR_POD: dict[str, Any] = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "app-1", "namespace": "shop", "labels": {},
                 "annotations": {"sidecar.istio.io/status": '{"containers":["istio-proxy"]}'}},
    "spec": {"initContainers": [{"name": "istio-validation"}],
             "containers": [{"name": "app"}, {"name": "istio-proxy", "args": ["proxy", "sidecar"], "env": []}]},
}  # fmt: skip


def pod(name: str, namespace: str = "shop", annotations: dict[str, str] | None = None,
        containers: list[str] | None = None) -> dict[str, Any]:
    out = json.loads(json.dumps(SIDECAR_POD))
    out["metadata"].update(name=name, namespace=namespace)
    out["metadata"]["annotations"].update(annotations or {})
    if containers is not None:
        out["spec"] = {"containers": [{"name": c} for c in containers]}
    return out


class Harness:
    """A CNI agent run dir (kubeconfig, log socket) and a way to invoke the plugin."""

    def __init__(self, api: PodApi, run_dir: Path) -> None:
        self.api = api
        self.run_dir = run_dir
        self.record = run_dir / "dry-run.txt"
        write_kubeconfig(run_dir, api.url, api.ca_pem)

    def config(self, version: str = "1.0.0", **fields: Any) -> dict[str, Any]:
        return {"cniVersion": version, "name": "k8s-pod-network", "type": "istio-cni",
                "cni_agent_run_dir": str(self.run_dir), "exclude_namespaces": ["kube-system"],
                "pod_namespace": "istio-system", "plugin_log_level": "debug", **fields}

    def env(self, command: str = "ADD", pod_name: str = "app-1", namespace: str = "shop",
            **extra: str) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", ""), "CNI_COMMAND": command, "CNI_CONTAINERID": "c0ffee",
               "CNI_NETNS": "/var/run/netns/iacni-gone", "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin",
               "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod_name}",
               "DRY_RUN_FILE_PATH": str(self.record), "ISTIO_CNI_POD_RETRIEVAL_MAX_RETRIES": "3",
               "ISTIO_CNI_POD_RETRIEVAL_INTERVAL": "10ms"}
        env.update(extra)
        return {k: v for k, v in env.items() if v != ""}

    def run(self, env: dict[str, str], stdin: bytes | dict[str, Any]) -> subprocess.CompletedProcess[bytes]:
        self.record.write_text("")
        data = stdin if isinstance(stdin, bytes) else json.dumps(stdin).encode()
        return subprocess.run([str(SCRIPT)], input=data, env=env, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def api() -> Iterator[PodApi]:
    folder = Path(tempfile.mkdtemp(prefix="iacni-api-"))
    server = PodApi(folder)
    server.add_pod(pod("app-1"))
    yield server
    server.close()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def cni(api: PodApi) -> Iterator[Harness]:
    need(SCRIPT.exists(), "istio-cni console script not installed")
    run_dir = Path(tempfile.mkdtemp(prefix="iacni-"))  # short: the log socket's path must fit sun_path
    yield Harness(api, run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)


def error(result: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    assert result.returncode != 0, result
    body: dict[str, Any] = json.loads(result.stdout)
    assert set(body) <= {"cniVersion", "code", "msg", "details"}
    return body


def test_malformed_stdin_is_code_6(cni: Harness) -> None:
    body = error(cni.run(cni.env(), b'{"cniVersion": "1.0.0", "name": '))
    assert body["code"] == 6 and "network configuration on stdin" in body["msg"]


def test_deep_stdin_is_code_6_and_no_traceback(cni: Harness) -> None:
    """100 KB of nested `[`: the spec's error object naming the nesting limit, not a RecursionError's traceback."""
    result = cni.run(cni.env(), b"[" * 100_000)
    body = error(result)
    assert body["code"] == 6 and "nested deeper than 128 levels" in body["msg"], body
    assert b"Traceback" not in result.stderr and b"RecursionError" not in result.stderr, result.stderr


def test_unsupported_version_is_code_1(cni: Harness) -> None:
    body = error(cni.run(cni.env(), cni.config(version="2.0.0")))
    assert body["code"] == 1 and "2.0.0" in body["msg"] and "1.1.0" in body["msg"]


def test_add_without_netns_is_code_4(cni: Harness) -> None:
    body = error(cni.run(cni.env(CNI_NETNS=""), cni.config()))
    assert body["code"] == 4 and "CNI_NETNS" in body["msg"]


def test_bad_plugin_field_is_code_7(cni: Harness) -> None:
    body = error(cni.run(cni.env(), cni.config(exclude_namespaces="kube-system")))
    assert body["code"] == 7 and "exclude_namespaces" in body["msg"]


def test_version_and_about(cni: Harness) -> None:
    result = cni.run({"CNI_COMMAND": "VERSION"}, b'{"cniVersion": "0.4.0"}')
    assert result.returncode == 0
    assert json.loads(result.stdout) == {"cniVersion": "0.4.0",
                                         "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}
    about = cni.run({}, b"")
    assert about.returncode == 0 and about.stdout == b"" and b"CNI protocol versions supported" in about.stderr


@pytest.mark.parametrize("version", ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
def test_prev_result_passthrough_for_each_version(cni: Harness, version: str) -> None:
    prev: dict[str, Any] = {"cniVersion": version, "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/x"}],
            "ips": [{"address": "10.88.0.5/16", "gateway": "10.88.0.1", "interface": 0}],
            "routes": [{"dst": "0.0.0.0/0"}], "dns": {"nameservers": ["10.96.0.10"]}}
    if version.startswith("0."):
        prev["ips"][0]["version"] = "4"
    result = cni.run(cni.env(CNI_ARGS=""), cni.config(version=version, prevResult=prev))  # not a Kubernetes pod
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == prev
    empty = cni.run(cni.env(CNI_ARGS=""), cni.config(version=version))
    assert json.loads(empty.stdout) == ({"cniVersion": version, "dns": {}} if version.startswith("0.")
                                        else {"cniVersion": version})


def test_status_and_gc_succeed_silently(cni: Harness) -> None:
    for command in ("STATUS", "GC"):
        result = cni.run({"CNI_COMMAND": command, "CNI_PATH": "/opt/cni/bin"}, cni.config(version="1.1.0"))
        assert (result.returncode, result.stdout) == (0, b"")
        assert error(cni.run({"CNI_COMMAND": command, "CNI_PATH": "/x"}, cni.config(version="1.0.0")))["code"] == 1


def test_del_and_check_succeed_with_the_pod_and_netns_gone(cni: Harness) -> None:
    (cni.run_dir / "istio-cni-kubeconfig").unlink()  # nothing to reach either
    for command, netns in (("DEL", ""), ("DEL", "/var/run/netns/iacni-gone"), ("CHECK", "/var/run/netns/iacni-gone")):
        result = cni.run(cni.env(command, pod_name="vanished", CNI_NETNS=netns), cni.config())
        assert (result.returncode, result.stdout) == (0, b""), result.stderr


def test_add_dry_run_records_the_rules_and_logs_to_the_socket(cni: Harness) -> None:
    logs = LogSocket(cni.run_dir / "log.sock")
    try:
        result = cni.run(cni.env(), cni.config(prevResult={"cniVersion": "1.0.0", "ips": []}))
    finally:
        logs.close()
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"cniVersion": "1.0.0", "ips": []}
    recorded = cni.record.read_text()
    assert "-A ISTIO_OUTPUT -j ISTIO_REDIRECT" in recorded and "--to-ports 15006" in recorded
    entries = logs.entries()
    assert any("Start iptables configuration for app-1" in e["msg"] for e in entries)
    assert all({"level", "time", "msg"} <= set(e) for e in entries)
    assert any(e.get("pod") == "shop/app-1" for e in entries)
    assert any(e["level"] == "debug" for e in entries)  # plugin_log_level debug honoured


def test_log_level_filters_the_socket_too(cni: Harness) -> None:
    logs = LogSocket(cni.run_dir / "log.sock")
    try:
        result = cni.run(cni.env(), cni.config(plugin_log_level="warn"))
    finally:
        logs.close()
    assert result.returncode == 0, result.stderr
    assert all(e["level"] in ("warn", "error") for e in logs.entries())


def test_a_dead_log_socket_does_not_fail_add(cni: Harness) -> None:
    dead = LogSocket(cni.run_dir / "log.sock")
    dead.server.server_close()  # the file stays, nobody accepts
    dead.server.shutdown()
    assert (cni.run_dir / "log.sock").exists()
    result = cni.run(cni.env(), cni.config())
    assert result.returncode == 0, result.stderr


def test_injection_annotation_fails_add_naming_it_and_records_nothing(cni: Harness, api: PodApi) -> None:
    api.add_pod(pod("evil", annotations={"traffic.sidecar.istio.io/excludeInterfaces": "eth0 -j ACCEPT"}))
    body = error(cni.run(cni.env(pod_name="evil"), cni.config()))
    assert "traffic.sidecar.istio.io/excludeInterfaces" in body["msg"] and "eth0 -j ACCEPT" in body["msg"]
    assert cni.record.read_text() == ""


def test_pods_that_need_nothing_get_nothing(cni: Harness, api: PodApi) -> None:
    api.add_pod(pod("plain", containers=["app"]))
    api.add_pod(pod("opted-out", annotations={"sidecar.istio.io/inject": "false"}))
    for name in ("plain", "opted-out"):
        result = cni.run(cni.env(pod_name=name), cni.config())
        assert result.returncode == 0, result.stderr
        assert cni.record.read_text() == ""
    before = len(api.requests)
    for name, namespace in (("app-1", "kube-system"), ("istio-cni-node-x1", "istio-system")):
        result = cni.run(cni.env(pod_name=name, namespace=namespace), cni.config())
        assert result.returncode == 0 and cni.record.read_text() == ""
    assert len(api.requests) == before  # decided without asking the API


def test_api_down_fails_with_try_again_later_after_the_retries(cni: Harness) -> None:
    write_kubeconfig(cni.run_dir, f"https://127.0.0.1:{closed_port()}", cni.api.ca_pem)
    body = error(cni.run(cni.env(), cni.config()))
    assert body["code"] == 11
    assert "after 3 attempts" in body["msg"] and "cannot connect" in body["msg"]
    assert cni.record.read_text() == ""


def test_a_missing_pod_is_retried_then_fails_naming_the_api_error(cni: Harness, api: PodApi) -> None:
    before = len(api.pod_requests())
    body = error(cni.run(cni.env(pod_name="not-yet"), cni.config()))
    assert body["code"] == 11 and 'pods "not-yet" not found' in body["msg"]
    assert len(api.pod_requests()) - before == 3


def test_a_wrong_token_or_no_kubeconfig_fails_with_try_again_later(cni: Harness) -> None:
    write_kubeconfig(cni.run_dir, cni.api.url, cni.api.ca_pem, token="wrong")
    body = error(cni.run(cni.env(), cni.config()))
    assert body["code"] == 11 and "Unauthorized" in body["msg"]
    (cni.run_dir / "istio-cni-kubeconfig").unlink()
    body = error(cni.run(cni.env(), cni.config()))
    assert body["code"] == 11 and "istio-cni-kubeconfig" in body["msg"]


def test_an_untrusted_server_is_not_spoken_to(cni: Harness) -> None:
    from cni_peers import make_tls

    _, _, other_ca = make_tls(cni.run_dir)
    write_kubeconfig(cni.run_dir, cni.api.url, other_ca)
    body = error(cni.run(cni.env(), cni.config()))
    assert body["code"] == 11 and "TLS" in body["msg"]


def test_ambient_enabled_says_it_is_not_supported(cni: Harness) -> None:
    result = cni.run(cni.env(), cni.config(ambient_enabled=True))
    assert result.returncode == 0, result.stderr
    assert b"ambient mode is not supported" in result.stderr  # at info: the log level is debug here
    assert "ISTIO_REDIRECT" in cni.record.read_text()


def test_tproxy_and_nftables_dry_runs(cni: Harness, api: PodApi) -> None:
    api.add_pod(pod("tp", annotations={"sidecar.istio.io/interceptionMode": "TPROXY"}))
    result = cni.run(cni.env(pod_name="tp"), cni.config())
    assert result.returncode == 0, result.stderr
    assert "-j TPROXY" in cni.record.read_text()
    result = cni.run(cni.env(), cni.config(native_nftables=True))
    assert result.returncode == 0, result.stderr
    recorded = cni.record.read_text()
    assert "table ip istio-proxy-nat" in recorded and "-A ISTIO" not in recorded
