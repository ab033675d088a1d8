"""Pods on a local node talking through their sidecars (root, real Envoys, real capture).

One node for the module: istiod-local on the gateway, `client-1` (service
account sleep, sidecar with DNS capture, no app), `echo-1` (service account echo, the echo app
behind service `echo` at 10.96.0.20:80) and `plain-1`, a pod outside the mesh
(no capture, no agent). The `default` namespace is STRICT.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from launchers import RegistryFile, local_node
from needs import need_root, need_tool
from support import poll

from istiod_local.node.demo import CLIENT_SPIFFE, ECHO_SERVICE, ECHO_SPIFFE, ECHO_URL, registry_yaml
from istiod_local.node.local_node import LocalNode, Pod
from istiod_local.node.plan import PodPlan, PodSpec

PY = sys.executable
ECHO_APP = [PY, "-m", "istiod_local.node.echo_app", "serve", "--port", "8080"]
STATS = {"proxyStatsMatcher": {"inclusionSuffixes": ["ssl.handshake"]}}


class Mesh:
    def __init__(self, node: LocalNode, pods: dict[str, Pod], plans: list[PodPlan]) -> None:
        self.node, self.pods, self.plans = node, pods, plans

    def get(self, pod: str, url: str, timeout: float = 5.0) -> dict[str, Any]:
        argv = [PY, "-m", "istiod_local.node.echo_app", "get", url, "--timeout", str(timeout)]
        done = self.node.exec(self.pods[pod], argv)
        answer: dict[str, Any] = json.loads(done.stdout) if done.stdout.strip() else {"error": done.stderr}
        return answer

    def set_mtls(self, mode: str) -> None:
        RegistryFile(self.node.registry).write(registry_yaml(self.plans, [ECHO_SERVICE], mode))


@pytest.fixture(scope="module")
def mesh() -> Iterator[Mesh]:
    need_root()
    for tool in ("ip", "setpriv", "iptables"):
        need_tool(tool)
    with local_node("ia-mesh-", ready_timeout=60, proxy_config=STATS) as node:
        plans = node.plan_pods([
            PodSpec("client-1", service_account="sleep", labels={"app": "sleep"}, dns_capture=True),
            PodSpec("echo-1", service_account="echo", labels={"app": "echo"}, app=ECHO_APP),
            PodSpec("plain-1", service_account="plain", sidecar=False),
        ])
        RegistryFile(node.registry).write(registry_yaml(plans, [ECHO_SERVICE], "STRICT"))
        node.start_istiod()
        pods = {plan.name: node.add_pod(plan) for plan in plans}
        node.wait_ready(pods.values(), {"echo-1": 8080})
        yield Mesh(node, pods, plans)


def _stat(mesh: Mesh, pod: str, name: str) -> int:
    for line in mesh.node.envoy_admin(mesh.pods[pod], "stats?filter=ssl.handshake").splitlines():
        key, _, value = line.partition(": ")
        if key == name:
            return int(value)
    return 0


def test_client_reaches_echo_through_both_sidecars_over_mtls(mesh: Mesh) -> None:
    answer = poll(lambda: (a := mesh.get("client-1", ECHO_URL)).get("status") == 200 and a,
                  "the echo service to answer the client")
    body = answer["body"]
    assert body["pod"] == "echo-1"
    xfcc = body["headers"]["x-forwarded-client-cert"]
    assert f"URI={CLIENT_SPIFFE}" in xfcc and f"By={ECHO_SPIFFE}" in xfcc, xfcc
    assert _stat(mesh, "client-1", "cluster.outbound|80||echo.default.svc.cluster.local;.ssl.handshake") >= 1
    assert _stat(mesh, "echo-1", "listener.0.0.0.0_15006.ssl.handshake") >= 1
    # The app saw the connection from its own sidecar (inbound cluster's 127.0.0.6), not from the client pod.
    log = (mesh.node.logs / "echo-1-app.log").read_text()
    assert "127.0.0.6 " in log and mesh.pods["client-1"].ip not in log


def test_strict_refuses_plaintext_from_a_pod_outside_the_mesh_and_permissive_accepts_it(mesh: Mesh) -> None:
    echo = mesh.pods["echo-1"]
    direct = f"http://{echo.ip}:8080/"
    refused = mesh.get("plain-1", direct)
    assert "error" in refused, refused  # the echo sidecar closed the plaintext connection
    assert mesh.pods["plain-1"].ip not in (mesh.node.logs / "echo-1-app.log").read_text()
    try:
        mesh.set_mtls("PERMISSIVE")
        answer = poll(lambda: (a := mesh.get("plain-1", direct)).get("status") == 200 and a,
                      "PERMISSIVE to reach the echo sidecar")
        assert "x-forwarded-client-cert" not in answer["body"]["headers"]
    finally:
        mesh.set_mtls("STRICT")
    poll(lambda: "error" in mesh.get("plain-1", direct), "STRICT to be back")
    # The meshed client is unaffected by the mode.
    assert mesh.get("client-1", ECHO_URL).get("status") == 200


def test_pod_outside_the_mesh_has_no_capture_and_no_agent(mesh: Mesh) -> None:
    plain = mesh.pods["plain-1"]
    assert plain.agent is None
    rules = mesh.node.exec(plain, ["iptables-save"]).stdout
    assert "ISTIO_" not in rules
    # Its request to the service VIP is not captured: nothing on the node answers 10.96.0.20.
    assert "error" in mesh.get("plain-1", ECHO_URL, timeout=1)


def test_client_with_dns_capture_reaches_echo_by_service_name(mesh: Mesh) -> None:
    """The agent's DNS proxy answers from istiod-local's NameTable; the app's port-53 query is captured."""
    rules = mesh.node.exec(mesh.pods["client-1"], ["iptables-save"]).stdout
    assert "-A ISTIO_OUTPUT_DNS" in rules and "15053" in rules, rules
    for url in ("http://echo.default.svc.cluster.local/", "http://echo/"):
        answer = poll(_answered(mesh, "client-1", url), f"{url} to answer")
        assert f"URI={CLIENT_SPIFFE}" in answer["body"]["headers"]["x-forwarded-client-cert"]


def _answered(mesh: Mesh, pod: str, url: str) -> Callable[[], Any]:
    def check() -> Any:
        answer = mesh.get(pod, url)
        return answer.get("status") == 200 and answer
    return check


def test_app_getaddrinfo_returns_the_cluster_ip_from_the_agent(mesh: Mesh) -> None:
    """The app's own resolver call (libc getaddrinfo, port 53 captured) gets the clusterIP from the agent."""
    script = ("import socket; print(sorted({a[4][0] for a in socket.getaddrinfo("
              "'echo.default.svc.cluster.local', 80, proto=socket.IPPROTO_TCP)}))")

    def resolved() -> Any:
        done = mesh.node.exec(mesh.pods["client-1"], [sys.executable, "-c", script])
        return done.returncode == 0 and done.stdout.strip()

    assert poll(resolved, "getaddrinfo to answer") == "['10.96.0.20']"
