"""istio-cni against istiod-local's Kubernetes API: the pods its injector rendering writes, its errors.

The registry's workloads become the Pods the plugin fetches (HTTPS, the CNI
identity's bearer token from `istiod-local kubeconfig`); ADD runs with
DRY_RUN_FILE_PATH, so the recording shows what would be applied.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from launchers import IstiodLocal, RegistryFile
from needs import need
from support import ISTIOD_LOCAL, VENV_BIN

SCRIPT = VENV_BIN / "istio-cni"
MESH = {
    "services": [{"name": "web", "namespace": "shop", "selector": {"app": "web"},
                  "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}],
    "workloads": [
        {"name": "web-1", "namespace": "shop", "serviceAccount": "web", "labels": {"app": "web"}, "ip": "10.244.1.5"},
        {"name": "web-tp", "namespace": "shop", "labels": {"app": "web"}, "ip": "10.244.1.6",
         "annotations": {"sidecar.istio.io/interceptionMode": "TPROXY",
                         "traffic.sidecar.istio.io/excludeOutboundPorts": "5432"}},
        {"name": "plain", "namespace": "shop", "sidecar": "none", "ip": "10.244.1.7"},
        {"name": "old-style", "namespace": "shop", "captureInit": "init", "ip": "10.244.1.8"},
        {"name": "evil", "namespace": "shop", "ip": "10.244.1.9",
         "annotations": {"traffic.sidecar.istio.io/excludeInterfaces": "eth0 -j ACCEPT"}},
        {"name": "amb-plain", "namespace": "amb", "sidecar": "none", "ip": "10.244.2.5"},
        {"name": "amb-sidecar", "namespace": "amb", "ip": "10.244.2.6"},
    ],
    "namespaces": {"amb": {"labels": {"istio.io/dataplane-mode": "ambient"}}},
}  # fmt: skip
SELECTORS = [
    {"podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}},
    {"podSelector": {"matchExpressions": [{"key": "istio.io/dataplane-mode", "operator": "NotIn",
                                           "values": ["none"]}]},
     "namespaceSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}},
]


@pytest.fixture(scope="module")
def istiod() -> Iterator[tuple[IstiodLocal, Path]]:
    need(ISTIOD_LOCAL.exists() and SCRIPT.exists(), "istiod-local and istio-cni console scripts needed")
    folder = Path(tempfile.mkdtemp(prefix="iacni-istiod-"))
    try:
        with IstiodLocal(folder / "state", registry=RegistryFile(folder / "mesh.yaml", MESH),
                         kube_api_addr="127.0.0.1:0") as server:
            run_dir = folder / "run"
            run_dir.mkdir()
            server.kubeconfig(run_dir / "istio-cni-kubeconfig", identity="istio-system/istio-cni")
            yield server, run_dir
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def add(run_dir: Path, name: str, record: Path, namespace: str = "shop", ambient: bool = False,
        **env: str) -> subprocess.CompletedProcess[bytes]:
    record.write_text("")
    config = {"cniVersion": "1.1.0", "name": "k8s-pod-network", "type": "istio-cni",
              "cni_agent_run_dir": str(run_dir), "exclude_namespaces": ["kube-system"],
              "prevResult": {"cniVersion": "1.1.0", "ips": [{"address": "10.244.1.5/24"}]},
              "ambient_enabled": ambient, "enablement_selectors": SELECTORS}
    full = {"PATH": os.environ.get("PATH", ""), "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c0ffee",
            "CNI_NETNS": "/var/run/netns/iacni-x", "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin",
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}",
            "DRY_RUN_FILE_PATH": str(record), "ISTIO_CNI_POD_RETRIEVAL_MAX_RETRIES": "2",
            "ISTIO_CNI_POD_RETRIEVAL_INTERVAL": "10ms", **env}
    return subprocess.run([str(SCRIPT)], input=json.dumps(config).encode(), env=full, capture_output=True,
                          timeout=60)


def test_injected_pod_is_captured_with_its_rendered_annotations(istiod: tuple[IstiodLocal, Path],
                                                                tmp_path: Path) -> None:
    record = tmp_path / "rec"
    result = add(istiod[1], "web-1", record)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"cniVersion": "1.1.0", "ips": [{"address": "10.244.1.5/24"}]}
    recorded = record.read_text()
    assert "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001" in recorded
    assert "-A ISTIO_INBOUND -p tcp --dport 15020 -j RETURN" in recorded


def test_tproxy_and_exclusions_from_workload_annotations(istiod: tuple[IstiodLocal, Path], tmp_path: Path) -> None:
    record = tmp_path / "rec"
    result = add(istiod[1], "web-tp", record)
    assert result.returncode == 0, result.stderr
    recorded = record.read_text()
    assert "-j TPROXY" in recorded and "--dport 5432 -j RETURN" in recorded


@pytest.mark.parametrize("name", ["plain", "old-style"])
def test_pods_istio_cni_must_leave_alone(istiod: tuple[IstiodLocal, Path], tmp_path: Path, name: str) -> None:
    record = tmp_path / "rec"
    result = add(istiod[1], name, record)
    assert result.returncode == 0, result.stderr
    assert record.read_text() == ""


def test_injection_annotation_is_refused(istiod: tuple[IstiodLocal, Path], tmp_path: Path) -> None:
    record = tmp_path / "rec"
    result = add(istiod[1], "evil", record)
    assert result.returncode != 0
    body = json.loads(result.stdout)
    assert "traffic.sidecar.istio.io/excludeInterfaces" in body["msg"] and "eth0 -j ACCEPT" in body["msg"]
    assert record.read_text() == ""


def test_unknown_pod_and_bad_token_are_try_again_later(istiod: tuple[IstiodLocal, Path], tmp_path: Path) -> None:
    record = tmp_path / "rec"
    body = json.loads(add(istiod[1], "nobody", record).stdout)
    assert body["code"] == 11 and 'pods "nobody" not found' in body["msg"]
    bad = tmp_path / "run"
    bad.mkdir()
    text = (istiod[1] / "istio-cni-kubeconfig").read_text()
    token_line = next(line for line in text.splitlines() if line.strip().startswith("token:"))
    (bad / "istio-cni-kubeconfig").write_text(text.replace(token_line, "    token: not-a-token"))
    body = json.loads(add(bad, "web-1", record).stdout)
    assert body["code"] == 11 and "Unauthorized" in body["msg"]
    assert record.read_text() == ""


def test_ambient_selected_pod_is_reported_as_unsupported(istiod: tuple[IstiodLocal, Path], tmp_path: Path) -> None:
    record = tmp_path / "rec"
    plain = add(istiod[1], "amb-plain", record, namespace="amb", ambient=True)
    assert plain.returncode == 0, plain.stderr
    assert b"selected for ambient mode" in plain.stderr and record.read_text() == ""
    # A sidecar pod is never ambient: it gets its sidecar capture, and no such warning.
    sidecar = add(istiod[1], "amb-sidecar", record, namespace="amb", ambient=True)
    assert sidecar.returncode == 0, sidecar.stderr
    assert b"selected for ambient mode" not in sidecar.stderr and "ISTIO_REDIRECT" in record.read_text()
    # Without ambient_enabled nothing is said.
    quiet = add(istiod[1], "amb-plain", record, namespace="amb")
    assert quiet.returncode == 0 and b"ambient" not in quiet.stderr
