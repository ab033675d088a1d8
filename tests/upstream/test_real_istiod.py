"""Our agent against upstream's real istiod (`pilot-discovery`), on a local node (root, real Envoy, CNI capture).

The node is made with `NodeOptions(control_plane="istiod")`: the real istiod runs in the node namespace beside
istiod-local (`istiod_local.node.istiod.RealIstiod`):
istiod-local is the cluster (its Kubernetes API serves the pods, Services and EndpointSlices from the
registry, and reviews the agents' tokens), the root of trust (istiod signs with an intermediate the root
signs, plugged in as `cacerts`), and istiod serves the xDS and the certificates. The node points the pods'
`discoveryAddress` and `CA_ADDR` at the real istiod; everything else is the node as ever.

Pods: two sidecars with the echo app (`echo-1` behind `echo`, `web-1` behind `web`), a proxyless gRPC
greeter (`greeter-1` behind `greeter`) and a proxyless gRPC client (`sleep-1`); the `default` namespace is
STRICT: the registry's mode, which the node writes into istiod's `--configDir` as a PeerAuthentication, with a
DestinationRule asking for ISTIO_MUTUAL to each service of mesh pods (the proxyless client's mTLS to the
greeter needs one, as upstream's proxyless gRPC guide has it).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography import x509
from launchers import RegistryFile, local_node
from needs import need_root, need_tool, need_upstream_commands
from node_pods import CONTROL_PORT, PodClient, spiffe_id

from istio_agent.pki.certs import load_pem_chain, uri_sans, verify_signed_by
from istiod_local.node.demo import registry_yaml
from istiod_local.node.istiod import RealIstiod
from istiod_local.node.local_node import LocalNode, Pod
from istiod_local.node.plan import PodSpec

pytestmark = pytest.mark.root

PY = sys.executable
ECHO_APP = [PY, "-m", "istiod_local.node.echo_app", "serve", "--port", "8080"]
GRPC_APPS = [PY, "-m", "istiod_local.node.grpc_apps"]
GRPC_PORT = 50051

SERVICES = [
    {"name": "echo", "namespace": "default", "selector": {"app": "echo"}, "clusterIP": "10.96.0.20",
     "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "HTTP"}]},
    {"name": "web", "namespace": "default", "selector": {"app": "web"}, "clusterIP": "10.96.0.21",
     "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "HTTP"}]},
    {"name": "greeter", "namespace": "default", "selector": {"app": "greeter"}, "clusterIP": "10.96.0.30",
     "ports": [{"name": "grpc", "port": 7070, "targetPort": GRPC_PORT, "protocol": "GRPC"}]},
]


def _pods() -> list[PodSpec]:
    return [
        PodSpec("echo-1", service_account="echo", labels={"app": "echo"}, app=ECHO_APP, dns_capture=True),
        PodSpec("web-1", service_account="web", labels={"app": "web"}, app=ECHO_APP, dns_capture=True),
        PodSpec("greeter-1", service_account="greeter", labels={"app": "greeter"}, proxyless=True,
                app=[*GRPC_APPS, "serve", "--port", str(GRPC_PORT)]),
        PodSpec("sleep-1", service_account="sleep", labels={"app": "sleep"}, proxyless=True,
                app=[*GRPC_APPS, "client", "--control-port", str(CONTROL_PORT)]),
    ]


class Mesh(PodClient):
    """The node's pods asked by name (`node_pods.PodClient`), and the real istiod's own ports."""

    def __init__(self, node: LocalNode, istiod: RealIstiod, pods: dict[str, Pod]) -> None:
        super().__init__(node, pods)
        self.istiod = istiod

    def istiod_metrics(self) -> str:
        """The real istiod's monitoring port, as a pod reaches it."""
        answer = self.get("echo-1", f"http://{self.istiod.plan.monitoring_address}/metrics")
        assert answer.get("status") == 200, answer
        return str(answer["body"])

    def syncz(self) -> list[dict[str, Any]]:
        """istiod's /debug/syncz (on its debug port, the node's loopback)."""
        done = subprocess.run(["ip", "netns", "exec", self.node.plan.netns, "curl", "-sf", "--max-time", "10",
                               f"http://{self.istiod.plan.http_address}/debug/syncz"],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        entries: list[dict[str, Any]] = json.loads(done.stdout)
        return entries


@pytest.fixture(scope="module")
def mesh() -> Iterator[Mesh]:
    need_root()
    for tool in ("ip", "setpriv", "unshare", "mount", "iptables", "curl"):
        need_tool(tool)
    need_upstream_commands("pilot-discovery")
    with local_node("ia-istiod-", ready_timeout=90, control_plane="istiod") as node:
        plans = node.plan_pods(_pods())
        RegistryFile(node.registry).write(registry_yaml(plans, SERVICES, "STRICT"))
        node.start_istiod()  # istiod-local, then the real istiod against its Kubernetes API
        assert node.real_istiod is not None
        pods = {pod.name: pod for pod in node.add_pods(plans)}
        node.wait_ready(pods.values(), {"echo-1": 8080, "web-1": 8080, "greeter-1": GRPC_PORT})
        yield Mesh(node, node.real_istiod, pods)


def _sds_chain(mesh: Mesh, pod: str) -> list[x509.Certificate]:
    """The certificate chain Envoy serves as `default`, from its config dump (SDS, as the agent gave it)."""
    dump = json.loads(mesh.node.envoy_admin(mesh.pods[pod], "config_dump?resource=dynamic_active_secrets"))
    for entry in dump["configs"]:
        if entry.get("name") == "default":
            data = entry["secret"]["tls_certificate"]["certificate_chain"]["inline_bytes"]
            return load_pem_chain(base64.b64decode(data))
    raise AssertionError(f"no default secret in {dump}")


@pytest.mark.parametrize(("pod", "account"), [("echo-1", "echo"), ("web-1", "web")])
def test_sidecar_certificate_comes_from_istiods_intermediate_under_istiod_locals_root(mesh: Mesh, pod: str,
                                                                                     account: str) -> None:
    chain = _sds_chain(mesh, pod)
    assert mesh.istiod.files is not None
    intermediate = mesh.istiod.files.intermediate.cert
    assert uri_sans(chain[0]) == [spiffe_id(account)]
    assert verify_signed_by(chain[0], intermediate), chain[0].issuer
    root = x509.load_pem_x509_certificate((mesh.pods[pod].dir / "var/run/secrets/istio/root-cert.pem").read_bytes())
    assert verify_signed_by(intermediate, root)
    assert not verify_signed_by(chain[0], root)  # istiod signed it, not istiod-local's own CA


@pytest.mark.parametrize("pod", ["echo-1", "greeter-1"])
def test_the_node_points_the_agents_at_the_real_istiod(mesh: Mesh, pod: str) -> None:
    agent = mesh.pods[pod].agent
    assert agent is not None
    environ = dict(item.split("=", 1) for item in
                   open(f"/proc/{agent.pid}/environ").read().split("\0") if "=" in item)  # noqa: SIM115
    assert environ["CA_ADDR"] == mesh.istiod.plan.discovery_address
    assert json.loads(environ["PROXY_CONFIG"])["discoveryAddress"] == mesh.istiod.plan.discovery_address


def test_proxyless_certificate_comes_from_istiods_intermediate(mesh: Mesh) -> None:
    pod = mesh.pods["greeter-1"]
    chain = load_pem_chain((pod.dir / "var/lib/istio/data/cert-chain.pem").read_bytes())
    assert mesh.istiod.files is not None
    assert uri_sans(chain[0]) == [spiffe_id("greeter")]
    assert verify_signed_by(chain[0], mesh.istiod.files.intermediate.cert)


def test_sidecar_gets_the_clusters_and_listeners_istiod_computed_from_the_kubernetes_api(mesh: Mesh) -> None:
    clusters = mesh.node.envoy_admin(mesh.pods["web-1"], "clusters")
    echo_ip = mesh.pods["echo-1"].ip
    assert f"outbound|80||echo.default.svc.cluster.local::{echo_ip}:8080::" in clusters, clusters
    assert "inbound|8080||" in clusters
    listeners = mesh.node.envoy_admin(mesh.pods["web-1"], "listeners")
    assert "virtualOutbound::0.0.0.0:15001" in listeners and "virtualInbound::0.0.0.0:15006" in listeners


@pytest.mark.parametrize(("client", "service"), [("web-1", "echo"), ("echo-1", "web")])
def test_sidecars_talk_mtls_with_verified_identities(mesh: Mesh, client: str, service: str) -> None:
    """By name (the agent's DNS proxy, from istiod's NameTable) through both sidecars: the server's Envoy
    verified the client's SPIFFE identity (URI=) and presented its own (By=)."""
    mesh.assert_mtls(client, f"http://{service}/", f"{service}-1", service, client[:-2])


def test_strict_refuses_plaintext(mesh: Mesh) -> None:
    mesh.assert_plaintext_refused("web-1", "echo-1")


def test_proxyless_client_talks_mtls_with_verified_identities(mesh: Mesh) -> None:
    reply = mesh.call("sleep-1", "xds:///greeter.default.svc.cluster.local:7070")["reply"]
    assert reply["pod"] == "greeter-1"
    assert reply["transport_security_type"] == ["tls"]
    assert reply["identities"] == [spiffe_id("sleep")], reply


@pytest.mark.parametrize("pod", ["echo-1", "web-1"])
def test_envoy_rejected_nothing_istiod_sent(mesh: Mesh, pod: str) -> None:
    """Every xDS update was accepted: no `update_rejected` anywhere in Envoy's stats."""
    stats = mesh.node.envoy_admin(mesh.pods[pod], "stats?filter=update_rejected")
    counters = dict(line.rsplit(": ", 1) for line in stats.splitlines() if ": " in line)
    assert counters and all(value == "0" for value in counters.values()), counters
    assert "listener_manager.lds.update_rejected" in counters and "cluster_manager.cds.update_rejected" in counters


def test_istiod_saw_no_nack_from_any_proxy(mesh: Mesh) -> None:
    """istiod's own view: each connected proxy (the sidecars and the proxyless pods) ACKed every type it was
    sent, and its reject counters are absent or zero. The proxyless client keeps a channel open, so that its
    xDS stream is there to be seen."""
    mesh.call("sleep-1", "xds:///greeter.default.svc.cluster.local:7070", fresh=False)
    entries = mesh.syncz()
    ids = {e["proxy"].split(".")[0] for e in entries}
    assert {"echo-1", "web-1", "greeter-1", "sleep-1"} <= ids, entries
    for entry in entries:
        resources = entry.get("resources") or {}
        assert resources, entry
        for type_url, status in resources.items():
            assert status.get("acked") == status.get("sent") and not status.get("lastError"), (type_url, entry)
    metrics = mesh.istiod_metrics()
    rejects = [line for line in metrics.splitlines() if "reject" in line and not line.startswith("#")]
    assert all(line.rsplit(" ", 1)[1] in ("0", "0.0") for line in rejects), rejects
