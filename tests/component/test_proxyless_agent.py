"""`pilot-agent proxy sidecar` in proxyless mode, as Istio's grpc-agent template runs it, against istiod-local.

The agent runs with the template's flags and environment (DISABLE_ENVOY,
ISTIO_META_GENERATOR=grpc, OUTPUT_CERTS) in a pod directory filled by
`istiod-local pod-files`. It must write the gRPC bootstrap, turn ready
(`pilot-agent wait`) only once the certificate files exist, and a real
grpcio xDS client reading that bootstrap must complete an RPC routed by
istiod-local's grpc generator through the agent's XDS socket (plaintext: the
client uses insecure channel credentials, so it ignores the clusters' mTLS;
mTLS end to end belongs to the e2e tier). istiod-local must log an ADS
connection for the bootstrap's node with the grpc generator, which only that
client can open (the agent alone never dials istiod in proxyless mode).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from fixtures import AgentStarter
from launchers import IstiodLocal, PilotAgent, RegistryFile, agent_environment, pilot_agent_cli
from support import VENV_BIN, free_port, http_request, poll

NODE_ID = "sidecar~127.0.0.1~sleep-1.default~default.svc.cluster.local"
BACKEND_IP = "127.0.0.2"
REGISTRY = """\
services:
- name: echo
  selector: {{app: echo}}
  ports: [{{name: grpc, port: 7070, targetPort: {port}}}]
workloads:
- {{name: echo-1, serviceAccount: echo, labels: {{app: echo}}, ip: {ip}}}
"""
TEMPLATE_ARGS = ["proxy", "sidecar", "--domain", "default.svc.cluster.local", "--proxyLogLevel=warning",
                 "--proxyComponentLogLevel=misc:error", "--log_output_level=default:info"]
# A grpcio xDS client: its xDS client starts with the first xds:/// channel and reads GRPC_XDS_BOOTSTRAP.
# It runs in its own process because grpc-core keeps one xDS client per process.
XDS_CLIENT = """\
import sys, grpc
channel = grpc.insecure_channel("xds:///echo.default.svc.cluster.local:7070")
try:
    response = channel.unary_unary("/echo.Echo/Call")(b"ping", timeout=float(sys.argv[1]))
    print("RPC OK", response.decode())
except grpc.RpcError as exc:
    print("RPC", exc.code().name, exc.details())
channel.close()
"""


def base_env() -> dict[str, str]:
    """Only what a process needs: nothing of the test runner's ISTIO_*/GRPC_* settings leaks in."""
    return {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")}


def ads_connections(istiod: IstiodLocal, node_id: str) -> list[str]:
    return [line for line in istiod.lines if f" connection {node_id}-" in line and "ADS: new" in line]


@pytest.fixture
def backend() -> Iterator[int]:
    """A plain gRPC server at the registry's endpoint: the RPC reaches it only if xDS resolved the endpoint."""
    def call(request: bytes, context: grpc.ServicerContext) -> bytes:
        return b"pong:" + request

    handler = grpc.method_handlers_generic_handler(
        "echo.Echo", {"Call": grpc.unary_unary_rpc_method_handler(call)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
    port = server.add_insecure_port(f"{BACKEND_IP}:0")
    server.start()
    yield port
    server.stop(grace=None).wait()


@pytest.fixture
def registry(tmp_path: Path, backend: int) -> RegistryFile:
    """The echo service at the backend's real port, served by the tier's `istiod` fixture."""
    return RegistryFile(tmp_path / "mesh.yaml", REGISTRY.format(port=backend, ip=BACKEND_IP))


@pytest.fixture
def pod(istiod: IstiodLocal) -> Iterator[Path]:
    """The `sleep-1` pod directory with its mounted root and token."""
    # A short root keeps <pod>/etc/istio/proxy/XDS well under the 107-byte unix socket limit.
    directory = Path(tempfile.mkdtemp(prefix="proxyless-", dir="/tmp"))
    try:
        yield istiod.pod_files(directory, service_account="sleep", pod="sleep-1")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@dataclass
class Proxyless:
    """A proxyless agent and where it serves and writes."""

    agent: PilotAgent
    status_port: int
    output_certs: Path

    def ready(self) -> tuple[int, str]:
        status, body = http_request("127.0.0.1", self.status_port, "/healthz/ready", timeout=2)
        return status, body.decode()

    def wait(self, timeout_seconds: int) -> subprocess.CompletedProcess[str]:
        return pilot_agent_cli("wait", f"--url=http://localhost:{self.status_port}/healthz/ready",
                               f"--timeoutSeconds={timeout_seconds}", "--periodMillis=100",
                               timeout=timeout_seconds + 30, env=base_env())


def start_proxyless(start_agent: AgentStarter, pod: Path, ca_address: str) -> Proxyless:
    status_port = free_port()
    output_certs = pod / "var/lib/istio/data"
    # The grpc-agent injection template's environment. The app here runs on the host, not in a container that
    # sees the pod's volume at /etc/istio/proxy, so configPath is the pod directory's absolute path (the
    # bootstrap's server URI is `unix:///` + configPath/XDS, as upstream joins it).
    proxy_config = {"statusPort": status_port, "configPath": str(pod / "etc/istio/proxy")}
    environment = agent_environment(
        pod="sleep-1", service_account="sleep", discovery=ca_address, proxy_config=proxy_config,
        base=base_env(), ISTIO_META_GENERATOR="grpc", DISABLE_ENVOY="true", OUTPUT_CERTS=str(output_certs),
        PILOT_CERT_PROVIDER="istiod", ISTIO_META_CLUSTER_ID="Kubernetes", TRUST_DOMAIN="cluster.local")
    return Proxyless(start_agent(pod, environment, args=TEMPLATE_ARGS), status_port, output_certs)


def read_bootstrap(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, json.JSONDecodeError):
        return None


def test_proxyless_agent_bootstrap_readiness_and_grpc_xds_client(
        pod: Path, istiod: IstiodLocal, start_agent: AgentStarter) -> None:
    agent = start_proxyless(start_agent, pod, istiod.secure_address)
    path = pod / "etc/istio/proxy/grpc-bootstrap.json"  # GRPC_XDS_BOOTSTRAP's default, relative to the pod root
    bootstrap = poll(lambda: read_bootstrap(path), "the gRPC bootstrap to be written", on_timeout=agent.agent.output)

    xds_socket = pod / "etc/istio/proxy/XDS"
    assert bootstrap["xds_servers"] == [{"server_uri": f"unix:///{xds_socket}", "channel_creds": [{"type": "insecure"}],
                                         "server_features": ["xds_v3"]}]
    node = bootstrap["node"]
    assert node["id"] == NODE_ID
    assert node["metadata"]["GENERATOR"] == "grpc"
    assert node["metadata"]["NAMESPACE"] == "default" and node["metadata"]["SERVICE_ACCOUNT"] == "sleep"
    assert node["metadata"]["PILOT_SAN"] == ["istiod.istio-system.svc"]
    files = bootstrap["certificate_providers"]["default"]["config"]
    assert [files["certificate_file"], files["private_key_file"], files["ca_certificate_file"]] == [
        str(agent.output_certs / name) for name in ("cert-chain.pem", "key.pem", "root-cert.pem")]
    assert bootstrap["server_listener_resource_name_template"] == "xds.istio.io/grpc/lds/inbound/%s"

    waited = agent.wait(timeout_seconds=30)
    assert waited.returncode == 0, f"{waited.stdout}{waited.stderr}\n{agent.agent.output()}"
    for name in ("cert-chain.pem", "key.pem", "root-cert.pem"):
        assert (agent.output_certs / name).is_file(), f"ready before {name} was written"
    assert agent.ready() == (200, "")

    assert ads_connections(istiod, NODE_ID) == [], "the agent alone must not have opened an ADS stream"
    client = subprocess.run(
        [str(VENV_BIN / "python"), "-c", XDS_CLIENT, "5"], capture_output=True, text=True, timeout=60,
        env={**base_env(), "GRPC_XDS_BOOTSTRAP": str(path)})
    context = f"client: {client.stdout}{client.stderr}\nistiod:\n{istiod.log_text()}\nagent:\n{agent.agent.output()}"
    assert client.returncode == 0, context
    assert client.stdout.strip() == "RPC OK pong:ping", context
    connections = poll(lambda: ads_connections(istiod, NODE_ID), "istiod-local to log the client's ADS stream",
                       on_timeout=lambda: context)
    assert all("(generator grpc)" in line for line in connections), "GENERATOR: grpc reached istiod unchanged"
    assert agent.agent.alive(), agent.agent.output()

    agent.agent.signal(signal.SIGTERM)
    assert agent.agent.wait_exit(20) == 0, agent.agent.output()
    assert path.exists(), "the bootstrap stays for the app after the agent stops"


def test_not_ready_while_the_certificates_are_missing(pod: Path, start_agent: AgentStarter) -> None:
    unreachable = f"localhost:{free_port()}"  # no CA there: the certificate never arrives
    agent = start_proxyless(start_agent, pod, unreachable)
    path = pod / "etc/istio/proxy/grpc-bootstrap.json"
    poll(lambda: read_bootstrap(path), "the gRPC bootstrap to be written", on_timeout=agent.agent.output)

    status, reason = agent.agent.wait_answering(agent.status_port)
    assert status == 503
    assert reason.decode() == f"{agent.output_certs / 'cert-chain.pem'} does not exist"
    waited = agent.wait(timeout_seconds=1)
    assert waited.returncode != 0
