"""`packaging/vm/istio-start.sh` with a recording `pilot-agent`: what it runs, with which arguments and environment.

The script is run as the unit's ExecStart runs it (working directory `/` of a
machine: here a temporary root, since its defaults are upstream's `./...`
paths), with onboarding files shaped like upstream's `cluster.env` (the keys
`istioctl x workload entry configure` writes). The fake `pilot-agent` appends
one JSON line per call (argv and the variables the capture and the agent
read), so each test checks what the real programs would have been given.
No root is needed: the agent's user is the caller's (`EXEC_USER=$USER`), the
path a service without USER takes is covered by the VM's e2e tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import ROOT

SCRIPT = ROOT / "packaging" / "vm" / "istio-start.sh"
RECORDED = ("ISTIO_INBOUND_PORTS", "ISTIO_LOCAL_EXCLUDE_PORTS", "ISTIO_SERVICE_CIDR", "ISTIO_META_DNS_CAPTURE",
            "ISTIO_INBOUND_INTERCEPTION_MODE", "ISTIO_META_AUTO_REGISTER_GROUP", "ISTIO_META_WORKLOAD_NAME",
            "SERVICE_ACCOUNT", "CA_ADDR", "PROV_CERT", "OUTPUT_CERTS", "PROXY_CONFIG", "INSTANCE_IP", "POD_NAME",
            "POD_NAMESPACE", "TRUST_DOMAIN", "CANONICAL_SERVICE")
FAKE = f"""#!{sys.executable}
import json, os, sys
keep = {RECORDED!r}
with open(os.environ["FAKE_AGENT_LOG"], "a") as out:
    out.write(json.dumps({{"argv0": sys.argv[0], "args": sys.argv[1:],
                          "env": {{k: os.environ[k] for k in keep if k in os.environ}}}}) + "\\n")
"""
# Upstream's cluster.env shape (istioctl's golden file's keys), for a WorkloadGroup `vm` in namespace `vmns`.
CLUSTER_ENV = """CANONICAL_REVISION='latest'
CANONICAL_SERVICE='vm'
CA_ADDR='istiod.istio-system.svc:15012'
ISTIO_INBOUND_PORTS='*'
ISTIO_LOCAL_EXCLUDE_PORTS='22,15090,15021,15020'
ISTIO_METAJSON_LABELS='{"app":"vm"}'
ISTIO_META_AUTO_REGISTER_GROUP='vm'
ISTIO_META_CLUSTER_ID='Kubernetes'
ISTIO_META_DNS_CAPTURE='true'
ISTIO_META_MESH_ID='cluster.local'
ISTIO_META_NETWORK=''
ISTIO_META_WORKLOAD_NAME='vm'
ISTIO_NAMESPACE='vmns'
ISTIO_SERVICE='vm.vmns'
ISTIO_SERVICE_CIDR='*'
ISTIO_SVC_IP='10.244.0.50'
POD_NAMESPACE='vmns'
SERVICE_ACCOUNT='vm-sa'
TRUST_DOMAIN='cluster.local'
"""


class Machine:
    """A temporary `/` with the onboarding files under var/lib/istio/envoy and a fake pilot-agent."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.envoy_dir = root / "var/lib/istio/envoy"
        self.envoy_dir.mkdir(parents=True)
        (self.envoy_dir / "cluster.env").write_text(CLUSTER_ENV)
        self.bin = root / "usr/local/bin"
        self.bin.mkdir(parents=True)
        self.log = root / "calls.jsonl"
        self.install_agent(self.bin)

    def install_agent(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        agent = folder / "pilot-agent"
        agent.write_text(FAKE)
        agent.chmod(0o755)
        return agent

    def run(self, *args: str, env: dict[str, str] | None = None,
            sidecar_env: str = "") -> subprocess.CompletedProcess[str]:
        if sidecar_env:
            (self.envoy_dir / "sidecar.env").write_text(sidecar_env)
        environment = {"PATH": "/usr/bin:/bin", "FAKE_AGENT_LOG": str(self.log), "USER": "me", "EXEC_USER": "me",
                       "ISTIO_BIN_BASE": str(self.bin), "ISTIO_AGENT_HOME": str(self.root / "nowhere"),
                       "POD_NAME": "vm-1", **(env or {})}
        return subprocess.run(["bash", str(SCRIPT), *args], cwd=self.root, env=environment, capture_output=True,
                              text=True, timeout=30)

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    return Machine(tmp_path)


def test_start_cleans_then_applies_capture_from_cluster_env_then_runs_the_agent(machine: Machine) -> None:
    done = machine.run()
    assert done.returncode == 0, done.stderr
    calls = machine.calls()
    assert [c["args"] for c in calls] == [["istio-iptables", "--cleanup-only"], ["istio-iptables"], ["proxy"]]
    capture = calls[1]["env"]
    # The capture settings reach istio-iptables as its own environment variables.
    assert capture["ISTIO_INBOUND_PORTS"] == "*"
    assert capture["ISTIO_LOCAL_EXCLUDE_PORTS"] == "22,15090,15021,15020"
    assert capture["ISTIO_SERVICE_CIDR"] == "*"
    assert capture["ISTIO_META_DNS_CAPTURE"] == "true"
    agent = calls[2]["env"]
    assert agent["CA_ADDR"] == "istiod.istio-system.svc:15012"
    assert agent["PROV_CERT"] == "./etc/certs" and agent["OUTPUT_CERTS"] == "./etc/certs"
    assert agent["INSTANCE_IP"] == "10.244.0.50" and agent["POD_NAME"] == "vm-1"
    assert agent["POD_NAMESPACE"] == "vmns"
    assert agent["ISTIO_META_AUTO_REGISTER_GROUP"] == "vm" and agent["SERVICE_ACCOUNT"] == "vm-sa"
    assert agent["PROXY_CONFIG"].split() == ["serviceCluster:", "vm.vmns", "controlPlaneAuthPolicy:", "MUTUAL_TLS"]


def test_clean_only_removes_the_capture(machine: Machine) -> None:
    assert machine.run("clean").returncode == 0
    assert [c["args"] for c in machine.calls()] == [["istio-iptables", "--cleanup-only"]]


def test_custom_iptables_leaves_capture_alone(machine: Machine) -> None:
    assert machine.run(sidecar_env="ISTIO_CUSTOM_IP_TABLES=true\n").returncode == 0
    assert [c["args"] for c in machine.calls()] == [["proxy"]]
    assert machine.run("clean").returncode == 0
    assert [c["args"] for c in machine.calls()] == [["proxy"]]


def test_init_passes_its_arguments_to_both_capture_calls_and_starts_nothing(machine: Machine) -> None:
    assert machine.run("-p", "15001", "-u", "1337").returncode == 0
    assert [c["args"] for c in machine.calls()] == [
        ["istio-iptables", "-p", "15001", "-u", "1337", "--cleanup-only"],
        ["istio-iptables", "-p", "15001", "-u", "1337"]]


def test_run_starts_the_agent_without_touching_capture(machine: Machine) -> None:
    assert machine.run("run").returncode == 0
    assert [c["args"] for c in machine.calls()] == [["proxy"]]


def test_sidecar_env_is_read_and_cluster_env_wins(machine: Machine) -> None:
    sidecar = "ISTIO_INBOUND_INTERCEPTION_MODE=REDIRECT\nISTIO_SERVICE_CIDR=10.96.0.0/16\n" \
              "ISTIO_AGENT_FLAGS='--proxyLogLevel debug --concurrency 2'\n"
    assert machine.run(sidecar_env=sidecar).returncode == 0
    calls = machine.calls()
    assert calls[1]["env"]["ISTIO_INBOUND_INTERCEPTION_MODE"] == "REDIRECT"
    assert calls[1]["env"]["ISTIO_SERVICE_CIDR"] == "*"  # cluster.env is read second
    assert calls[2]["args"] == ["proxy", "--proxyLogLevel", "debug", "--concurrency", "2"]


def test_pilot_port_sets_the_ca_and_the_discovery_address(machine: Machine) -> None:
    (machine.envoy_dir / "cluster.env").write_text(CLUSTER_ENV.replace("CA_ADDR='istiod.istio-system.svc:15012'\n",
                                                                       ""))
    assert machine.run(env={"ISTIO_PILOT_PORT": "15099"}).returncode == 0
    agent = machine.calls()[2]["env"]
    assert agent["CA_ADDR"] == "istiod.istio-system.svc:15099"
    assert "discoveryAddress: istiod.istio-system.svc:15099" in agent["PROXY_CONFIG"]


def test_given_proxy_config_and_cert_dirs_are_kept(machine: Machine) -> None:
    env = {"PROXY_CONFIG": "binaryPath: /opt/envoy", "PROV_CERT": "", "OUTPUT_CERTS": "/var/certs"}
    assert machine.run(env=env).returncode == 0
    agent = machine.calls()[2]["env"]
    assert agent["PROXY_CONFIG"] == "binaryPath: /opt/envoy"
    assert agent["PROV_CERT"] == "" and agent["OUTPUT_CERTS"] == "/var/certs"


def test_tproxy_runs_the_agent_as_root(machine: Machine) -> None:
    """Under TPROXY the agent's user is root: a caller that is root (USER=root) starts it directly."""
    done = machine.run(env={"USER": "root", "ISTIO_INBOUND_INTERCEPTION_MODE": "TPROXY"})
    assert done.returncode == 0, done.stderr
    assert machine.calls()[-1]["args"] == ["proxy"]
    assert machine.calls()[-1]["env"]["ISTIO_INBOUND_INTERCEPTION_MODE"] == "TPROXY"


def test_unknown_exec_user_is_refused_by_name(machine: Machine) -> None:
    done = machine.run("run", env={"EXEC_USER": "no-such-user-ia"})
    assert done.returncode != 0
    assert "EXEC_USER no-such-user-ia: no such user" in done.stderr
    assert machine.calls() == []


def test_pilot_agent_is_found_in_the_package_venv_then_on_path(machine: Machine, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    venv_agent = machine.install_agent(tmp_path / "venv" / "bin")
    assert machine.run("run", env={"ISTIO_BIN_BASE": str(empty), "ISTIO_AGENT_HOME": str(tmp_path / "venv")}
                       ).returncode == 0
    assert machine.calls()[-1]["argv0"] == str(venv_agent)
    on_path = machine.install_agent(tmp_path / "onpath")
    done = machine.run("run", env={"ISTIO_BIN_BASE": str(empty), "PATH": f"{on_path.parent}:/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert machine.calls()[-1]["argv0"] == str(on_path)
    done = machine.run("run", env={"ISTIO_BIN_BASE": str(empty)})
    assert done.returncode != 0
    assert f"no pilot-agent in {empty}" in done.stderr
    assert len(machine.calls()) == 2


def test_the_unit_runs_the_script_at_its_installed_path_and_cleans_on_stop() -> None:
    unit = (ROOT / "packaging" / "vm" / "istio.service").read_text()
    lines = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert lines["ExecStart"] == "/usr/local/bin/istio-start.sh"
    assert lines["ExecStopPost"] == "/usr/local/bin/istio-start.sh clean"
    assert lines["Restart"] == "always" and lines["KillMode"] == "mixed"
    assert os.access(SCRIPT, os.X_OK)
