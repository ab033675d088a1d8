"""Proxyless gRPC pods on a local node, as Istio's grpc-agent template runs them (root, network namespaces).

One node for the module, istiod-local on the gateway, the `default` namespace
STRICT. Pods (`node/proxyless.py`): each proxyless pod runs `pilot-agent proxy
sidecar` (DISABLE_ENVOY, grpc generator, OUTPUT_CERTS=/var/lib/istio/data)
and, once its postStart hook `pilot-agent wait` on :15020 succeeded, a grpcio
app reading `GRPC_XDS_BOOTSTRAP=/etc/istio/proxy/grpc-bootstrap.json`; both
containers see the pod's volumes at the template's absolute paths through
their own mount namespaces.

- `greeter-1`: `grpc.server(..., xds=True)` with `xds_server_credentials`
  behind service `greeter` (port 7070 → 50051);
- `sleep-1`: a long-running client dialing `xds:///greeter...:7070` with
  `xds_channel_credentials`, driven through its control port;
- `greeter-r`, `sleep-r`: the same pair behind service `greeter-rot`, with
  20 s certificates (SECRET_TTL; the agent rotates them after about half of
  that, as the default grace ratio 0.5 says);
- `plain-1`: a pod outside the mesh (no agent, no capture).

The rotation pair's apps read a copy of the agent's bootstrap whose
file_watcher `refresh_interval` is 1s instead of upstream's 900s: grpc-core
re-reads the certificate files only at that interval (first read at
start-up), so with 900s no rotation is visible within a test. Everything else
in their bootstrap is the agent's.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from launchers import RegistryFile, local_node
from needs import need_root, need_tool
from support import PILOT_AGENT, poll

from istiod_local.node.demo import registry_yaml
from istiod_local.node.local_node import LocalNode, Pod
from istiod_local.node.plan import PodSpec

PY = sys.executable
APPS = [PY, "-m", "istiod_local.node.grpc_apps"]
GRPC_PORT = 50051
CONTROL_PORT = 8081
GREETER = "xds:///greeter.default.svc.cluster.local:7070"
GREETER_ROT = "xds:///greeter-rot.default.svc.cluster.local:7071"
SLEEP_ID = "spiffe://cluster.local/ns/default/sa/sleep"
GREETER_ID = "spiffe://cluster.local/ns/default/sa/greeter"
ROTATING_TTL = "20s"
SERVICES: list[dict[str, Any]] = [
    {"name": "greeter", "namespace": "default", "selector": {"app": "greeter"}, "clusterIP": "10.96.0.30",
     "ports": [{"name": "grpc", "port": 7070, "targetPort": GRPC_PORT, "protocol": "GRPC"}]},
    {"name": "greeter-rot", "namespace": "default", "selector": {"app": "greeter-rot"}, "clusterIP": "10.96.0.31",
     "ports": [{"name": "grpc", "port": 7071, "targetPort": GRPC_PORT, "protocol": "GRPC"}]},
]


def _pods() -> list[PodSpec]:
    server = [*APPS, "serve", "--port", str(GRPC_PORT)]
    client = [*APPS, "client", "--control-port", str(CONTROL_PORT)]
    fast = ["--cert-refresh-interval", "1s"]
    rotating = {"SECRET_TTL": ROTATING_TTL}
    return [
        PodSpec("greeter-1", service_account="greeter", labels={"app": "greeter"}, proxyless=True, app=server),
        PodSpec("sleep-1", service_account="sleep", labels={"app": "sleep"}, proxyless=True, app=client),
        PodSpec("greeter-r", service_account="greeter", labels={"app": "greeter-rot"}, proxyless=True,
                app=[*server, *fast], agent_env=rotating),
        PodSpec("sleep-r", service_account="sleep", labels={"app": "sleep-rot"}, proxyless=True,
                app=[*client, *fast], agent_env=rotating),
        PodSpec("plain-1", service_account="plain", sidecar=False),
    ]


class Mesh:
    def __init__(self, node: LocalNode, pods: dict[str, Pod]) -> None:
        self.node, self.pods = node, pods

    def call(self, pod: str, target: str, fresh: bool = True) -> dict[str, Any]:
        """One RPC made by the long-running client app of `pod` (through its control port)."""
        url = f"http://127.0.0.1:{CONTROL_PORT}/call?target={target}&fresh={int(fresh)}"
        done = self.node.exec(self.pods[pod], [PY, "-m", "istiod_local.node.echo_app", "get", url, "--timeout", "30"])
        answer: dict[str, Any] = json.loads(done.stdout) if done.stdout.strip() else {"error": done.stderr}
        assert answer.get("status") == 200, answer
        result: dict[str, Any] = answer["body"]
        return result

    def run_app(self, pod: str, *args: str) -> dict[str, Any]:
        done = self.node.exec(self.pods[pod], [*APPS, *args])
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    def cert_serial(self, pod: str) -> str:
        """The serial of the certificate the pod's agent keeps in OUTPUT_CERTS (the pod's istio-data volume)."""
        pem = (self.pods[pod].dir / "var/lib/istio/data/cert-chain.pem").read_bytes()
        return format(x509.load_pem_x509_certificate(pem).serial_number, "x")

    def app_log(self, pod: str) -> str:
        return (self.node.logs / f"{pod}-app.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def mesh() -> Iterator[Mesh]:
    need_root()
    for tool in ("ip", "setpriv", "unshare", "mount"):
        need_tool(tool)
    with local_node("ia-proxyless-", ready_timeout=60) as node:
        plans = node.plan_pods(_pods())
        RegistryFile(node.registry).write(registry_yaml(plans, SERVICES, "STRICT"))
        node.start_istiod()
        pods = {pod.name: pod for pod in node.add_pods(plans)}
        node.wait_ready(pods.values(), {name: GRPC_PORT for name in ("greeter-1", "greeter-r")})
        yield Mesh(node, pods)


def test_rpc_over_mtls_shows_the_client_spiffe_id(mesh: Mesh) -> None:
    result = poll(lambda: (r := mesh.call("sleep-1", GREETER))["ok"] and r, "an RPC to the greeter")
    reply = result["reply"]
    assert reply["pod"] == "greeter-1"
    assert reply["identities"] == [SLEEP_ID], reply
    assert reply["transport_security_type"] == ["tls"]
    assert SLEEP_ID in reply["sans"]
    # The client presented the certificate its agent wrote to OUTPUT_CERTS.
    assert reply["peer_serial"] == mesh.cert_serial("sleep-1")
    # A short name resolves through the client's namespace, on the client's existing xDS client.
    assert mesh.call("sleep-1", "xds:///greeter:7070")["reply"]["identities"] == [SLEEP_ID]
    # The server presents its own workload identity.
    server = mesh.run_app("sleep-1", "tls-peer", "--addr", f"{mesh.pods['greeter-1'].ip}:{GRPC_PORT}",
                          "--cert-dir", str(mesh.pods["sleep-1"].dir / "var/lib/istio/data"))
    assert server.get("sans") == [GREETER_ID], server
    assert server["serial"] == mesh.cert_serial("greeter-1")


def test_strict_refuses_a_plaintext_client(mesh: Mesh) -> None:
    poll(lambda: mesh.call("sleep-1", GREETER)["ok"], "the greeter to serve mesh clients")
    refused = mesh.run_app("plain-1", "call", "--plain", "--target", f"{mesh.pods['greeter-1'].ip}:{GRPC_PORT}")
    assert refused["ok"] is False and refused["code"] == "UNAVAILABLE", refused
    # The server is unharmed and still serves the mesh client.
    assert mesh.pods["greeter-1"].app is not None and mesh.pods["greeter-1"].app.running()
    assert mesh.call("sleep-1", GREETER)["ok"]


def test_pods_follow_the_grpc_agent_template(mesh: Mesh) -> None:
    for name in ("greeter-1", "sleep-1", "greeter-r", "sleep-r"):
        pod = mesh.pods[name]
        # postStart (`pilot-agent wait` on :15020) returned 0 before the app started, and the app found
        # the bootstrap and the certificates in place when it started.
        assert pod.post_start == 0
        report = json.loads(next(line for line in mesh.app_log(name).splitlines() if line.startswith('{"bootstrap"')))
        assert report["bootstrap_present"] and report["cert_files_present"], report
        done = mesh.node.exec(pod, [str(PILOT_AGENT), "wait",
                                    "--url=http://localhost:15020/healthz/ready", "--timeoutSeconds=10"])
        assert done.returncode == 0, done.stdout + done.stderr
        # No istio-init: nothing is captured.
        assert "ISTIO_" not in mesh.node.exec(pod, ["iptables-save"]).stdout
    # The bootstrap holds the template's absolute paths, which exist only inside the pods' mount namespaces.
    bootstrap = json.loads((mesh.pods["greeter-1"].dir / "etc/istio/proxy/grpc-bootstrap.json").read_text())
    # `unix:///` + filepath.Join(configPath, "XDS"), as upstream writes it: with the template's relative
    # default, the path at which the app container sees the shared volume.
    assert bootstrap["xds_servers"][0]["server_uri"] == "unix:///etc/istio/proxy/XDS"
    config = bootstrap["certificate_providers"]["default"]["config"]
    assert config["certificate_file"] == "/var/lib/istio/data/cert-chain.pem"
    assert config["refresh_interval"] == "900s"
    assert bootstrap["node"]["id"] == f"sidecar~{mesh.pods['greeter-1'].ip}~greeter-1.default~default.svc.cluster.local"
    assert bootstrap["node"]["metadata"]["GENERATOR"] == "grpc"
    assert not Path("/etc/istio/proxy/XDS").exists() and not Path("/etc/istio/proxy/grpc-bootstrap.json").exists()


def test_new_connections_present_rotated_certificates_without_app_restarts(mesh: Mesh) -> None:
    server, client = mesh.pods["greeter-r"], mesh.pods["sleep-r"]
    assert server.app is not None and client.app is not None
    pids = (server.app.pid, client.app.pid)
    certs = str(client.dir / "var/lib/istio/data")
    address = f"{server.ip}:{GRPC_PORT}"

    def presented() -> tuple[str, str]:
        """(server's leaf on a new TLS connection, client leaf the server saw on a new gRPC connection)."""
        served = mesh.run_app("sleep-r", "tls-peer", "--addr", address, "--cert-dir", certs).get("serial", "")
        result = mesh.call("sleep-r", GREETER_ROT)
        return served, result["reply"]["peer_serial"] if result["ok"] else ""

    poll(lambda: all(presented()), "RPCs between the rotating pods")
    first = (mesh.cert_serial("greeter-r"), mesh.cert_serial("sleep-r"))
    # The agents rotate both certificates in OUTPUT_CERTS...
    poll(lambda: mesh.cert_serial("greeter-r") != first[0] and mesh.cert_serial("sleep-r") != first[1],
               "both agents to rotate their certificates")

    # ...and new connections, in both directions, then carry certificates the agents wrote after that.
    def current() -> bool:
        files = (mesh.cert_serial("greeter-r"), mesh.cert_serial("sleep-r"))
        seen = presented()
        return seen == files and not set(seen) & set(first)

    poll(current, "new connections to present the rotated certificates")
    assert (server.app.pid, client.app.pid) == pids and server.app.running() and client.app.running()
