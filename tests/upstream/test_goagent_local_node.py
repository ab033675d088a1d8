"""Upstream's Go pilot-agent against istiod-local, on a local node beside ours (root, real Envoy, real capture).

What this proves is that istiod-local speaks upstream's protocols as the real agent expects them: the
Go agent gets its certificate from istiod-local's CA, its Envoy's xDS and its NameTable through
istiod-local's ADS, answers DNS from that table, and reports ready; and that its pods and ours trust
each other, in both directions, with the identities each side verified.

One node for the module (CNI capture, the `default` namespace STRICT). Each pair is one pod on
upstream's agent (`go-...`) and one on ours, same roles:

- sidecars with DNS capture and the echo app: `go-echo-1` behind `go-echo`, `echo-1` behind `echo`;
- proxyless (Istio's grpc-agent template): greeters `go-greeter-1` / `greeter-1` behind `go-greeter` /
  `greeter`, and long-running clients `go-sleep-1` / `sleep-1` driven through their control port.
"""

from __future__ import annotations

import filecmp
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography import x509
from launchers import RegistryFile, local_node
from needs import need_root, need_tool, need_upstream_commands
from node_pods import CONTROL_PORT, PodClient, spiffe_id
from support import poll

from istio_agent.pki.certs import uri_sans
from istiod_local.node.demo import registry_yaml
from istiod_local.node.plan import PodSpec
from istiod_local.node.upstream import UPSTREAM

pytestmark = pytest.mark.root

PY = sys.executable
ECHO_APP = [PY, "-m", "istiod_local.node.echo_app", "serve", "--port", "8080"]
GRPC_APPS = [PY, "-m", "istiod_local.node.grpc_apps"]
GRPC_PORT = 50051


def _service(name: str, ip: str, port: int, target: int, protocol: str) -> dict[str, Any]:
    return {"name": name, "namespace": "default", "selector": {"app": name}, "clusterIP": ip,
            "ports": [{"name": protocol.lower(), "port": port, "targetPort": target, "protocol": protocol}]}


SERVICES = [
    _service("echo", "10.96.0.20", 80, 8080, "HTTP"),
    _service("go-echo", "10.96.0.21", 80, 8080, "HTTP"),
    _service("greeter", "10.96.0.30", 7070, GRPC_PORT, "GRPC"),
    _service("go-greeter", "10.96.0.31", 7070, GRPC_PORT, "GRPC"),
]


def _pods() -> list[PodSpec]:
    server = [*GRPC_APPS, "serve", "--port", str(GRPC_PORT)]
    client = [*GRPC_APPS, "client", "--control-port", str(CONTROL_PORT)]
    pods = []
    for prefix, implementation in (("", "istio-agent"), ("go-", UPSTREAM)):
        pods += [
            PodSpec(f"{prefix}echo-1", service_account=f"{prefix}echo", labels={"app": f"{prefix}echo"},
                    app=ECHO_APP, dns_capture=True, agent_implementation=implementation),
            PodSpec(f"{prefix}greeter-1", service_account=f"{prefix}greeter", labels={"app": f"{prefix}greeter"},
                    proxyless=True, app=server, agent_implementation=implementation),
            PodSpec(f"{prefix}sleep-1", service_account=f"{prefix}sleep", labels={"app": f"{prefix}sleep"},
                    proxyless=True, app=client, agent_implementation=implementation),
        ]
    return pods


class Mesh(PodClient):
    """The node's pods, ours and the Go agent's, asked by name (`node_pods.PodClient`)."""


@pytest.fixture(scope="module")
def mesh() -> Iterator[Mesh]:
    need_root()
    for tool in ("ip", "setpriv", "unshare", "mount", "iptables"):
        need_tool(tool)
    need_upstream_commands("pilot-agent")
    with local_node("ia-goagent-", ready_timeout=60) as node:
        plans = node.plan_pods(_pods())
        RegistryFile(node.registry).write(registry_yaml(plans, SERVICES, "STRICT"))
        node.start_istiod()
        pods = {pod.name: pod for pod in node.add_pods(plans)}
        node.wait_ready(pods.values(), {"echo-1": 8080, "go-echo-1": 8080, "greeter-1": GRPC_PORT,
                                        "go-greeter-1": GRPC_PORT})
        yield Mesh(node, pods)


@pytest.mark.parametrize("pod", ["go-echo-1", "go-greeter-1", "go-sleep-1"])
def test_the_pod_runs_upstreams_agent_as_the_proxy_user(mesh: Mesh, pod: str) -> None:
    agent = mesh.pods[pod].agent
    assert agent is not None and agent.running()
    exe = os.path.realpath(f"/proc/{agent.pid}/exe")
    # The binary itself, or the node's copy of it where uid 1337 reaches it (a checkout under a 0700 home).
    assert filecmp.cmp(exe, mesh.node.upstream.pilot_agent, shallow=False), exe
    status = open(f"/proc/{agent.pid}/status").read()  # noqa: SIM115
    assert "\nUid:\t1337\t1337\t1337\t1337\n" in status, status


def test_go_sidecar_serves_the_certificate_istiod_local_signed_for_its_identity(mesh: Mesh) -> None:
    """Envoy's certificates come from the Go agent's SDS, which got them from istiod-local's CA."""
    certs = json.loads(mesh.node.envoy_admin(mesh.pods["go-echo-1"], "certs"))
    uris = {san.get("uri") for entry in certs["certificates"] for cert in entry.get("cert_chain", [])
            for san in cert.get("subject_alt_names", [])}
    assert spiffe_id("go-echo") in uris, certs
    root = (mesh.pods["go-echo-1"].dir / "var/run/secrets/istio/root-cert.pem").read_text()
    serials = {cert["serial_number"] for entry in certs["certificates"] for cert in entry.get("ca_cert", [])}
    # Envoy writes a serial as its bytes in hex (a leading zero kept): compared as numbers.
    assert x509.load_pem_x509_certificate(root.encode()).serial_number in {int(s, 16) for s in serials}, certs


def test_go_sidecar_gets_its_clusters_and_listeners_from_istiod_local(mesh: Mesh) -> None:
    go = mesh.pods["go-echo-1"]
    clusters = mesh.node.envoy_admin(go, "clusters")
    echo_ip = mesh.pods["echo-1"].ip
    assert f"outbound|80||echo.default.svc.cluster.local::{echo_ip}:8080::" in clusters
    assert "inbound|8080||::" in clusters
    listeners = mesh.node.envoy_admin(go, "listeners")
    assert "virtualOutbound::0.0.0.0:15001" in listeners and "virtualInbound::0.0.0.0:15006" in listeners, listeners


def test_go_agent_answers_dns_from_istiod_local_name_table(mesh: Mesh) -> None:
    dig = need_tool("dig")
    go = mesh.pods["go-echo-1"]

    def answer(name: str) -> str:
        done = mesh.node.exec(go, [dig, "+short", "+time=2", "+tries=1", "-p", "15053", "@127.0.0.1", name])
        return done.stdout.strip()

    assert poll(lambda: answer("echo.default.svc.cluster.local"), "the Go agent's DNS proxy") == "10.96.0.20"
    assert answer("go-greeter.default.svc.cluster.local") == "10.96.0.31"
    # The app's own port-53 query is captured to it (DNS capture): a short name resolves as in a pod.
    script = "import socket; print(socket.gethostbyname('go-echo'))"
    assert mesh.node.exec(go, [PY, "-c", script]).stdout.strip() == "10.96.0.21"


@pytest.mark.parametrize("port", [15021, 15020])
def test_go_sidecar_reports_ready(mesh: Mesh, port: int) -> None:
    """Envoy's :15021 (what wait_ready probed) and the Go agent's own status port answer ready."""
    url = f"http://{mesh.pods['go-echo-1'].ip}:{port}/healthz/ready"
    assert mesh.get("echo-1", url).get("status") == 200


@pytest.mark.parametrize(("client", "service", "server"), [("go-echo-1", "echo", "echo"),
                                                           ("echo-1", "go-echo", "go-echo")])
def test_sidecars_of_both_agents_talk_mtls_with_verified_identities(mesh: Mesh, client: str, service: str,
                                                                    server: str) -> None:
    """By name (each client's DNS proxy) through both sidecars: the server's Envoy verified the client's identity
    (URI=) and presented its own (By=)."""
    mesh.assert_mtls(client, f"http://{service}/", f"{server}-1", server, client[:-2])


def test_strict_refuses_plaintext_at_the_go_sidecar(mesh: Mesh) -> None:
    """A plaintext connection from a pod's own capture-exempt user (1337) to the Go sidecar's app port is refused."""
    mesh.assert_plaintext_refused("echo-1", "go-echo-1")  # the Go sidecar's inbound closes it


@pytest.mark.parametrize(("client", "server"), [("go-sleep-1", "greeter"), ("sleep-1", "go-greeter")])
def test_proxyless_pods_of_both_agents_talk_mtls_with_verified_identities(mesh: Mesh, client: str,
                                                                          server: str) -> None:
    """grpcio's xDS client reads each agent's bootstrap; the server saw the client's certificate."""
    reply = mesh.call(client, f"xds:///{server}.default.svc.cluster.local:7070")["reply"]
    assert reply["pod"] == f"{server}-1"
    assert reply["transport_security_type"] == ["tls"]
    assert reply["identities"] == [spiffe_id(client[:-2])], reply


def test_go_proxyless_agent_writes_its_certificate_and_bootstrap_where_the_template_says(mesh: Mesh) -> None:
    pod = mesh.pods["go-greeter-1"]
    chain = (pod.dir / "var/lib/istio/data/cert-chain.pem").read_bytes()
    assert uri_sans(x509.load_pem_x509_certificate(chain)) == [spiffe_id("go-greeter")]
    bootstrap = json.loads((pod.dir / "etc/istio/proxy/grpc-bootstrap.json").read_text())
    assert bootstrap["node"]["id"].startswith(f"sidecar~{pod.ip}~go-greeter-1.default~"), bootstrap["node"]
    assert pod.post_start == 0  # upstream's `pilot-agent wait` saw it ready before the app started
