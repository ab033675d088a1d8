"""istio-cni ADD (sidecar mode) against upstream's golden dry-run recordings (conformance/cni-plugin).

Each case runs two ways:

- the real `istio-cni` console script, with the case's CNI environment and
  network config on stdin and `DRY_RUN_FILE_PATH` set, looking its pod up
  over HTTPS with a bearer token in a kubeconfig laid out as install-cni
  writes it (the case's `cni_agent_run_dir` of `/` is pointed at a fresh
  folder holding that kubeconfig: nothing else of the config changes);
- the pure steps: the pod to the capture configuration (asserted against
  the case's `effective_iptables_config`), then that configuration to rules.

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
from cni_peers import PodApi, write_kubeconfig
from needs import need, need_conformance
from support import CONFORMANCE, VENV_BIN

KIT = CONFORMANCE / "cni-plugin"


def _cases() -> list[dict[str, Any]]:
    path = KIT / "cases.json"
    if not path.exists():
        return []
    cases: list[dict[str, Any]] = json.loads(path.read_text())["cases"]
    return cases


CASES = _cases()
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


@pytest.fixture(scope="module")
def api() -> Iterator[PodApi]:
    folder = Path(tempfile.mkdtemp(prefix="iacni-conf-"))
    server = PodApi(folder)
    yield server
    server.close()
    shutil.rmtree(folder, ignore_errors=True)


def test_kit_is_complete() -> None:
    assert len(CASES) == 5
    assert all((KIT / c["golden"]).exists() and c["score"] for c in CASES)
    assert all(golden(c) for c in CASES)


def test_parser_is_order_insensitive_across_tables_only() -> None:
    a = "* nat\n-A X\nCOMMIT\n* mangle\n-A Y\nCOMMIT\n"
    b = "iptables-save\n* mangle\n-A Y\nCOMMIT\n* nat\n-A X\nCOMMIT\niptables-save\n"
    assert parse_tables(a) == parse_tables(b)
    assert parse_tables("* nat\n-A X\n-A Z\nCOMMIT") != parse_tables("* nat\n-A Z\n-A X\nCOMMIT")


def derived_config(case: dict[str, Any]) -> Any:
    from istio_agent.cni.plugin.podinfo import capture_config, extract_pod_info, skip_reason

    info = extract_pod_info(case["pod"])
    assert skip_reason(info) is None
    warnings: list[str] = []
    cfg = capture_config(info, case["cni_invocation"]["netns"], dry_run=True, native_nftables=False, env={},
                         warn=warnings.append)
    assert warnings == []
    return cfg.replace(enable_ipv6=case["host_facts"]["enable_ipv6"])


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_pod_to_effective_config(case: dict[str, Any]) -> None:
    from istio_agent.capture.config import FIELDS

    cfg = derived_config(case)
    by_key = {key: name for name, key, _ in FIELDS}
    derived = {}
    for key in case["effective_iptables_config"]:
        value = getattr(cfg, by_key[key])
        derived[key] = [] if value is None and key.startswith("DNS_SERVERS") else value
    assert derived == case["effective_iptables_config"]


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
def test_istio_cni_add_dry_run_matches_golden(case: dict[str, Any], api: PodApi, tmp_path: Path) -> None:
    script = VENV_BIN / "istio-cni"
    need(script.exists(), "istio-cni console script not installed")
    need(_host_is_ipv4_first(), "the kit's host fact is an IPv4 host; this host's first address is IPv6 or none")
    api.add_pod(case["pod"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_kubeconfig(run_dir, api.url, api.ca_pem)
    config = {**case["plugin_config"], "cni_agent_run_dir": str(run_dir)}
    record = tmp_path / "dry-run.txt"
    record.write_text("")
    inv = case["cni_invocation"]
    env = {"PATH": os.environ.get("PATH", ""), "CNI_COMMAND": inv["command"], "CNI_CONTAINERID": inv["container_id"],
           "CNI_NETNS": inv["netns"], "CNI_IFNAME": inv["ifname"], "CNI_ARGS": inv["args"], "CNI_PATH": inv["path"],
           "DRY_RUN_FILE_PATH": str(record)}
    before = len(api.pod_requests())
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
    pod = case["pod"]["metadata"]
    assert api.pod_requests()[before:] == [f"/api/v1/namespaces/{pod['namespace']}/pods/{pod['name']}"]
