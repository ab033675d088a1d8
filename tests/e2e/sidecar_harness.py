"""Scenario plumbing for the single-sidecar tests: Envoy's view through its admin API, pod namespaces.

The processes themselves come from `launchers` (istiod-local, `pilot-agent
proxy sidecar` as the injector runs it) through the tier's fixtures. On the
host network the agent and its Envoy use the fixed sidecar ports, so only one
agent runs at a time (the `start_agent` fixture takes the host ports lock);
`Netns` gives a pod its own network namespace (plus a client namespace joined
by a veth pair) when a test needs traffic capture. Every helper kills what it
started and deletes what it made.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from needs import need, need_root, need_tool
from support import VENV_BIN, http_request

ISTIO_IPTABLES = VENV_BIN / "istio-iptables"
PEERS = Path(__file__).resolve().parent / "sidecar_peers.py"
SPIFFE_ECHO = "spiffe://cluster.local/ns/default/sa/echo"
# Injector-style capture: everything in and out, Istio's own ports excluded inbound.
CAPTURE_ARGS = ("-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*",
                "-d", "15090,15021,15020")


def stats(admin_port: int = 15000, host: str = "127.0.0.1") -> dict[str, int]:
    status, body = http_request(host, admin_port, "/stats")
    assert status == 200, body
    out = {}
    for line in body.decode().splitlines():
        name, _, value = line.partition(": ")
        if value.strip().isdigit():
            out[name] = int(value)
    return out


def netns_prefix(netns: str | None) -> list[str]:
    return ["ip", "netns", "exec", netns] if netns else []


# ---- Envoy's view -------------------------------------------------------------------------------


def config_dump(host: str = "127.0.0.1") -> dict[str, Any]:
    status, body = http_request(host, 15000, "/config_dump?include_eds", timeout=5)
    assert status == 200, body[:300]
    result: dict[str, Any] = json.loads(body)
    return result


def dump_section(dump: dict[str, Any], kind: str) -> dict[str, Any]:
    for config in dump["configs"]:
        if config["@type"].endswith("." + kind):
            section: dict[str, Any] = config
            return section
    return {}


def active_secret(dump: dict[str, Any], name: str) -> dict[str, Any] | None:
    for item in dump_section(dump, "SecretsConfigDump").get("dynamic_active_secrets", []):
        if item.get("name") == name:
            secret: dict[str, Any] = item["secret"]
            return secret
    return None


def inline_bytes(source: dict[str, Any]) -> bytes:
    """A DataSource from a config dump: inline bytes are base64 in JSON."""
    if "inline_bytes" in source:
        return base64.b64decode(source["inline_bytes"])
    return str(source.get("inline_string", "")).encode()


def active_listener_names(dump: dict[str, Any]) -> set[str]:
    listeners = dump_section(dump, "ListenersConfigDump").get("dynamic_listeners", [])
    return {item["name"] for item in listeners if "active_state" in item}


# ---- network namespaces -------------------------------------------------------------------------


def sh(*argv: str) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr}"
    return done.stdout


class Netns:
    """A pod namespace and a client namespace joined by a veth pair; the pod's traffic is captured."""

    POD_IP = "10.78.0.2"
    CLIENT_IP = "10.78.0.1"

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.pod = f"sc-pod-{tag}"
        self.client = f"sc-cli-{tag}"
        self.created: list[str] = []

    @staticmethod
    def check_prerequisites() -> None:
        need_root()
        need_tool("ip")
        need_tool("curl")
        need_tool("iptables-restore")
        need(ISTIO_IPTABLES.exists(), f"needs {ISTIO_IPTABLES}")

    def create(self) -> None:
        for ns in (self.pod, self.client):
            sh("ip", "netns", "add", ns)
            self.created.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", self.pod, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", self.client)
        for ns, ip in ((self.pod, self.POD_IP), (self.client, self.CLIENT_IP)):
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "netns", "exec", self.pod, str(ISTIO_IPTABLES), *CAPTURE_ARGS)

    def destroy(self) -> None:
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self.created.clear()

    def exec_python(self, ns: str, *args: str, stdin: int | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, str(PEERS), *args],
                                stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def http(self, ns: str, url: str, method: str = "GET") -> tuple[int, str]:
        """A request made from inside `ns` (curl), for ports only reachable there; status 0 when none came."""
        done = subprocess.run(["ip", "netns", "exec", ns, "curl", "-s", "-m", "2", "-X", method, "-o", "-",
                               "-w", "\n%{http_code}", url], capture_output=True, text=True, timeout=10)
        body, _, code = done.stdout.rpartition("\n")
        return int(code or 0), body

