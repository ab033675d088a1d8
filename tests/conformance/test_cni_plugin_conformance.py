"""istio-cni ADD (sidecar mode) against upstream's golden dry-run recordings (conformance/cni-plugin).

Each case runs two ways:

- the real `istio-cni` console script, with the case's CNI environment and
  network config on stdin and `DRY_RUN_FILE_PATH` set, looking its pod up in
  a real istiod-local's Kubernetes API (HTTPS, bearer token, the CNI's
  identity, `istiod-local kubeconfig`). Each case's pod is a registry
  workload: the case's annotations as the workload's, its containers, env
  and securityContext as the workload's `pod` overlay, so istiod-local serves
  the injected pod with the case's capture facts (asserted: the served pod
  derives the case's `effective_iptables_config`). Kubernetes names are DNS
  labels, so the kit's `testNS/testPod` (which only upstream's fake client
  accepts) is served as `testns/<case name>` and CNI_ARGS name that; the
  goldens do not depend on the name. The case's `cni_agent_run_dir` of `/`
  is pointed at a fresh folder holding the kubeconfig; nothing else of the
  config changes.
- the pure steps: the case's pod to the capture configuration (asserted
  against the case's `effective_iptables_config`), then that configuration
  to rules.

Recordings and goldens are compared with the kit's parser (README: split on
COMMIT, drop the `iptables-save` probe lines, one map entry per table).
The kit is read at test time, never copied.
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
from launchers import IstiodLocal, RegistryFile
from needs import need, need_conformance
from support import CONFORMANCE, ISTIOD_LOCAL, VENV_BIN, conformance_cases

KIT = CONFORMANCE / "cni-plugin"


CASES = conformance_cases("cni-plugin")
IDS = [c["name"] for c in CASES]


def parse_tables(text: str) -> dict[str, str]:
    """The kit's comparison parser: table name -> its lines plus COMMIT, probe lines dropped."""
    tables: dict[str, str] = {}
    for piece in text.split("COMMIT"):
        lines = [line for line in piece.strip("\n").split("\n") if line not in ("iptables-save", "ip6tables-save")]
        if lines and lines[0].startswith("* "):
            tables[lines[0][2:]] = "\n".join([*lines, "COMMIT"])
    return tables


def golden(case: dict[str, Any]) -> dict[str, str]:
    return parse_tables((KIT / case["golden"]).read_text())


@pytest.fixture(autouse=True)
def _kit() -> None:
    need_conformance("cni-plugin")
    need(bool(CASES), "conformance/cni-plugin/cases.json holds no cases")


SERVED_NAMESPACE = "testns"


def served_name(case: dict[str, Any]) -> str:
    return str(case["name"]).lower()


def workload(case: dict[str, Any]) -> dict[str, Any]:
    """The registry workload istiod-local renders as the case's pod (injected, CNI capture)."""
    pod = case["pod"]
    return {"name": served_name(case), "namespace": SERVED_NAMESPACE, "serviceAccount": "default",
            "labels": dict(pod["metadata"].get("labels") or {}), "annotations": dict(pod["metadata"]["annotations"]),
            "sidecar": "envoy", "captureInit": "cni", "pod": {"spec": pod["spec"]}}


@pytest.fixture(scope="module")
def istiod() -> Iterator[tuple[IstiodLocal, Path]]:
    need(ISTIOD_LOCAL.exists(), "istiod-local console script not installed")
    folder = Path(tempfile.mkdtemp(prefix="iacni-conf-"))
    registry = RegistryFile(folder / "mesh.yaml", {"workloads": [workload(c) for c in CASES]})
    try:
        with IstiodLocal(folder / "state", registry=registry, kube_api_addr="127.0.0.1:0") as server:
            run_dir = folder / "run"
            run_dir.mkdir()
            server.kubeconfig(run_dir / "istio-cni-kubeconfig", identity="istio-system/istio-cni")
            yield server, run_dir
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_kit_is_complete() -> None:
    assert all((KIT / c["golden"]).exists() for c in CASES)
    assert all(golden(c) for c in CASES)


def test_parser_is_order_insensitive_across_tables_only() -> None:
    a = "* nat\n-A X\nCOMMIT\n* mangle\n-A Y\nCOMMIT\n"
    b = "iptables-save\n* mangle\n-A Y\nCOMMIT\n* nat\n-A X\nCOMMIT\niptables-save\n"
    assert parse_tables(a) == parse_tables(b)
    assert parse_tables("* nat\n-A X\n-A Z\nCOMMIT") != parse_tables("* nat\n-A Z\n-A X\nCOMMIT")


def derived_config(case: dict[str, Any], pod: dict[str, Any] | None = None) -> Any:
    from istio_agent.cni.plugin.podinfo import capture_config, extract_pod_info, skip_reason

    info = extract_pod_info(pod or case["pod"])
    assert skip_reason(info) is None
    warnings: list[str] = []
    cfg = capture_config(info, case["cni_invocation"]["netns"], dry_run=True, native_nftables=False, env={},
                         warn=warnings.append)
    assert warnings == []
    return cfg.replace(enable_ipv6=case["host_facts"]["enable_ipv6"])


def effective(cfg: Any, case: dict[str, Any]) -> dict[str, Any]:
    from istio_agent.capture.config import FIELDS

    by_key = {key: name for name, key, _ in FIELDS}
    derived = {}
    for key in case["effective_iptables_config"]:
        value = getattr(cfg, by_key[key])
        derived[key] = [] if value is None and key.startswith("DNS_SERVERS") else value
    return derived


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_pod_to_effective_config(case: dict[str, Any]) -> None:
    assert effective(derived_config(case), case) == case["effective_iptables_config"]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_istiod_local_serves_the_cases_capture_facts(case: dict[str, Any], istiod: tuple[IstiodLocal, Path]) -> None:
    """The pod istiod-local serves for the case derives the case's configuration (through the plugin's client)."""
    from istio_agent.kube.client import get_pod, load_kubeconfig

    cfg = load_kubeconfig(str(istiod[1] / "istio-cni-kubeconfig"))
    served: dict[str, Any] = get_pod(cfg, SERVED_NAMESPACE, served_name(case))
    assert served["metadata"]["annotations"]["sidecar.istio.io/status"] == "true"
    assert effective(derived_config(case, served), case) == case["effective_iptables_config"]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_effective_config_rules_match_golden(case: dict[str, Any]) -> None:
    from istio_agent.capture.iptables_text import dry_run_record
    from istio_agent.capture.rules import build_rules

    cfg = derived_config(case)
    recorded = "\n".join(dry_run_record(build_rules(cfg), cfg.ipv6))
    assert parse_tables(recorded) == golden(case)


def _host_is_ipv4_first() -> bool:
    from istio_agent.capture.hostfacts import HostFactError, detect_ipv6

    try:
        return not detect_ipv6(False)
    except HostFactError:
        return False


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_istio_cni_add_dry_run_matches_golden(case: dict[str, Any], istiod: tuple[IstiodLocal, Path],
                                              tmp_path: Path) -> None:
    script = VENV_BIN / "istio-cni"
    need(script.exists(), "istio-cni console script not installed")
    need(_host_is_ipv4_first(), "the kit's host fact is an IPv4 host; this host's first address is IPv6 or none")
    config = {**case["plugin_config"], "cni_agent_run_dir": str(istiod[1])}
    record = tmp_path / "dry-run.txt"
    record.write_text("")
    inv = case["cni_invocation"]
    assert inv["args"] == "K8S_POD_NAMESPACE=testNS;K8S_POD_NAME=testPod"
    args = f"K8S_POD_NAMESPACE={SERVED_NAMESPACE};K8S_POD_NAME={served_name(case)}"
    env = {"PATH": os.environ.get("PATH", ""), "CNI_COMMAND": inv["command"], "CNI_CONTAINERID": inv["container_id"],
           "CNI_NETNS": inv["netns"], "CNI_IFNAME": inv["ifname"], "CNI_ARGS": args, "CNI_PATH": inv["path"],
           "DRY_RUN_FILE_PATH": str(record)}
    result = subprocess.run([str(script)], input=json.dumps(config).encode(), env=env, capture_output=True,
                            timeout=60)
    assert result.returncode == 0, (result.stdout, result.stderr)
    # Chained: the previous result comes back, in the config's version.
    out = json.loads(result.stdout)
    prev = {k: v for k, v in case["plugin_config"]["prevResult"].items() if k.lower() != "cniversion"}
    assert out == {"cniVersion": case["plugin_config"]["cniVersion"], **prev}
    recorded = record.read_text()
    assert recorded.strip() != ""
    assert parse_tables(recorded) == golden(case)
