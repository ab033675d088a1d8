"""istio-cni ADD in real network namespaces (root): the rules really land in the pod's netns, or nothing does.

Each test makes a pod namespace wired by a veth pair to a peer namespace
(`iacni-pod-*`, `iacni-peer-*`, IPv4 only, so the plugin's host-fact
detection inside the pod netns sees an IPv4 pod), serves the pod from an
HTTPS pod API on the host's loopback, and runs the installed `istio-cni` as
the runtime would, without DRY_RUN_FILE_PATH. What the kernel holds is read
back with `iptables-save` / `nft list ruleset` inside the namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cni_peers import PodApi, closed_port, write_kubeconfig
from needs import need, need_root, need_tool
from support import VENV_BIN

SCRIPT = VENV_BIN / "istio-cni"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=60)


def sidecar_pod(name: str, namespace: str = "shop", annotations: dict[str, str] | None = None,
                containers: tuple[str, ...] = ("app", "istio-proxy")) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {},
                     "annotations": {"sidecar.istio.io/status": "{}", **(annotations or {})}},
        "spec": {"containers": [{"name": c, **({"args": ["proxy", "sidecar"]} if c == "istio-proxy" else {})}
                                for c in containers]},
    }  # fmt: skip


class PodNetns:
    """A pod namespace with an IPv4 veth to a peer namespace, and the plugin run against it."""

    def __init__(self, api: PodApi, run_dir: Path) -> None:
        tag = uuid.uuid4().hex[:8]
        self.pod, self.peer = f"iacni-pod-{tag}", f"iacni-peer-{tag}"
        self.api = api
        self.run_dir = run_dir

    @property
    def path(self) -> str:
        return f"/run/netns/{self.pod}"

    def create(self) -> None:
        sh("ip", "netns", "add", self.pod)
        sh("ip", "netns", "add", self.peer)
        sh("ip", "-n", self.pod, "link", "set", "lo", "up")
        sh("ip", "-n", self.pod, "link", "add", "eth0", "type", "veth", "peer", "name", "v1", "netns", self.peer)
        sh("ip", "-n", self.pod, "addr", "add", "10.78.0.2/24", "dev", "eth0")
        sh("ip", "-n", self.peer, "addr", "add", "10.78.0.1/24", "dev", "v1")
        sh("ip", "-n", self.pod, "link", "set", "eth0", "up")
        sh("ip", "-n", self.peer, "link", "set", "v1", "up")

    def destroy(self) -> None:
        for ns in (self.pod, self.peer):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)

    def add(self, pod_name: str, namespace: str = "shop", command: str = "ADD", netns: str = "",
            inside: str = "", dry_run_file: Path | None = None, **fields: Any) -> subprocess.CompletedProcess[bytes]:
        config = {"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "istio-cni",
                  "cni_agent_run_dir": str(self.run_dir), "exclude_namespaces": ["kube-system"],
                  "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.78.0.2/24", "interface": 0}]},
                  **fields}
        env = {"PATH": os.environ.get("PATH", ""), "CNI_COMMAND": command, "CNI_CONTAINERID": "c0ffee",
               "CNI_NETNS": netns or self.path, "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin",
               "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod_name}",
               "ISTIO_CNI_POD_RETRIEVAL_MAX_RETRIES": "2", "ISTIO_CNI_POD_RETRIEVAL_INTERVAL": "10ms"}
        if dry_run_file is not None:
            env["DRY_RUN_FILE_PATH"] = str(dry_run_file)
        argv = ["ip", "netns", "exec", inside, str(SCRIPT)] if inside else [str(SCRIPT)]
        return subprocess.run(argv, input=json.dumps(config).encode(), env=env, capture_output=True, timeout=60)

    def iptables(self) -> str:
        """Every rule line of both iptables backends and both families inside the pod netns."""
        lines = []
        for tool in ("iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save", "ip6tables-legacy-save"):
            if shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin"):
                out = sh("ip", "netns", "exec", self.pod, tool, check=False).stdout
                lines += [line for line in out.splitlines() if line.startswith("-A ")]
        return "\n".join(lines)

    def nft(self) -> str:
        return sh("ip", "netns", "exec", self.pod, "nft", "list", "ruleset").stdout

    def ip_rules(self) -> str:
        return sh("ip", "-n", self.pod, "rule", "show").stdout


@pytest.fixture(scope="module")
def api() -> Iterator[PodApi]:
    folder = Path(tempfile.mkdtemp(prefix="iacni-api-"))
    server = PodApi(folder)
    yield server
    server.close()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def ns(api: PodApi) -> Iterator[PodNetns]:
    need_root()
    for tool in ("ip", "iptables-save", "nft"):
        need_tool(tool)
    need(SCRIPT.exists(), "istio-cni console script not installed")
    run_dir = Path(tempfile.mkdtemp(prefix="iacni-run-"))
    write_kubeconfig(run_dir, api.url, api.ca_pem)
    t = PodNetns(api, run_dir)
    try:
        t.create()
        yield t
    finally:
        t.destroy()
        shutil.rmtree(run_dir, ignore_errors=True)


def ok(result: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    assert result.returncode == 0, (result.stdout, result.stderr)
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def failed(result: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    assert result.returncode != 0, result
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def test_sidecar_pod_gets_its_rules_in_its_netns(ns: PodNetns, api: PodApi) -> None:
    api.add_pod(sidecar_pod("web"))
    out = ok(ns.add("web"))
    assert out == {"cniVersion": "1.0.0", "ips": [{"address": "10.78.0.2/24", "interface": 0}]}
    rules = ns.iptables()
    assert "-A OUTPUT -j ISTIO_OUTPUT" in rules
    assert "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001" in rules
    assert "-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006" in rules
    host = sh("iptables-save").stdout
    assert "ISTIO_REDIRECT" not in host  # the host's own tables are untouched
    # DEL and CHECK afterwards succeed; DEL once the netns is gone too.
    assert ok_empty(ns.add("web", command="CHECK"))
    ns.destroy()
    assert ok_empty(ns.add("web", command="DEL"))


def ok_empty(result: subprocess.CompletedProcess[bytes]) -> bool:
    assert result.returncode == 0, result.stderr
    return result.stdout == b""


def test_tproxy_pod_gets_mangle_rules_and_its_routing(ns: PodNetns, api: PodApi) -> None:
    api.add_pod(sidecar_pod("tp", annotations={"sidecar.istio.io/interceptionMode": "TPROXY"}))
    ok(ns.add("tp"))
    rules = ns.iptables()
    assert "-j TPROXY" in rules and "--on-port 15006" in rules
    assert "fwmark 0x539 lookup 133" in ns.ip_rules()


def test_native_nftables(ns: PodNetns, api: PodApi) -> None:
    api.add_pod(sidecar_pod("nf"))
    ok(ns.add("nf", native_nftables=True))
    ruleset = ns.nft()
    assert "table ip istio-proxy-nat" in ruleset and "redirect to :15001" in ruleset
    assert ns.iptables() == ""


def test_injection_annotation_fails_and_nothing_is_applied(ns: PodNetns, api: PodApi) -> None:
    api.add_pod(sidecar_pod("evil", annotations={"traffic.sidecar.istio.io/excludeInterfaces": "eth0 -j ACCEPT"}))
    body = failed(ns.add("evil"))
    assert "traffic.sidecar.istio.io/excludeInterfaces" in body["msg"] and "eth0 -j ACCEPT" in body["msg"]
    assert ns.iptables() == ""
    assert "istio" not in ns.nft()


def test_pods_without_sidecar_and_excluded_namespaces_get_nothing(ns: PodNetns, api: PodApi) -> None:
    api.add_pod(sidecar_pod("plain", containers=("app",)))
    api.add_pod(sidecar_pod("web", namespace="kube-system"))
    ok(ns.add("plain"))
    ok(ns.add("web", namespace="kube-system"))
    assert ns.iptables() == ""


def test_api_down_is_try_again_later_and_nothing_is_applied(ns: PodNetns, api: PodApi) -> None:
    api.add_pod(sidecar_pod("web"))
    write_kubeconfig(ns.run_dir, f"https://127.0.0.1:{closed_port()}", api.ca_pem)
    body = failed(ns.add("web"))
    assert body["code"] == 11 and "after 2 attempts" in body["msg"]
    assert ns.iptables() == ""


def test_netns_of_the_plugin_itself_is_refused(ns: PodNetns, api: PodApi) -> None:
    """skel's rule; run from inside the peer namespace, so a broken check could only ever touch that one."""
    api.add_pod(sidecar_pod("web"))
    body = failed(ns.add("web", netns=f"/run/netns/{ns.peer}", inside=ns.peer))
    assert body["code"] == 8 and ns.peer in body["msg"]
    assert "ISTIO" not in sh("ip", "netns", "exec", ns.peer, "iptables-save").stdout


def test_dry_run_reads_the_pods_addresses_inside_its_netns(ns: PodNetns, api: PodApi, tmp_path: Path) -> None:
    """As upstream's dry run: the IPv6 mode comes from the pod's netns (here IPv6 only), not the plugin's own;
    with no address there at all ADD fails, nothing recorded."""
    api.add_pod(sidecar_pod("dry"))
    sh("ip", "-n", ns.pod, "addr", "del", "10.78.0.2/24", "dev", "eth0")
    sh("ip", "-n", ns.pod, "addr", "add", "fd00:78::2/64", "dev", "eth0", "nodad")
    record = tmp_path / "rules.txt"
    ok(ns.add("dry", dry_run_file=record))
    assert "-A ISTIO_OUTPUT -o lo -s ::6/128 -j RETURN" in record.read_text()
    assert ns.iptables() == ""  # recorded, not applied
    record.unlink()
    sh("ip", "-n", ns.pod, "addr", "del", "fd00:78::2/64", "dev", "eth0")
    assert failed(ns.add("dry", dry_run_file=record))["code"] == 999 and not record.exists()
