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
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import VENV_BIN
from support import LineCollector, free_port, poll, serving_addresses, stop_process

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


@dataclass
class Istiod:
    state: Path
    proc: subprocess.Popen[str]
    out: LineCollector
    secure: str

    def ads_connections(self, node_id: str) -> list[str]:
        return [line for line in list(self.out.lines) if f" connection {node_id}-" in line and "ADS: new" in line]


@pytest.fixture
def pod() -> Iterator[Path]:
    # A short root keeps <pod>/etc/istio/proxy/XDS well under the 107-byte unix socket limit.
    directory = Path(tempfile.mkdtemp(prefix="proxyless-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


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
def istiod(pod: Path, backend: int) -> Iterator[Istiod]:
    state = pod.parent / f"{pod.name}-istiod"
    registry = pod.parent / f"{pod.name}-mesh.yaml"
    registry.write_text(REGISTRY.format(port=backend, ip=BACKEND_IP))
    proc = subprocess.Popen(
        [str(VENV_BIN / "istiod-local"), "serve", "--state-dir", str(state), "--grpc-addr", "127.0.0.1:0",
         "--secure-grpc-addr", "127.0.0.1:0", "--registry", str(registry)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=base_env())
    out = LineCollector(proc.stderr)
    try:
        _, secure = serving_addresses(proc, out, timeout=30.0)
        subprocess.run([str(VENV_BIN / "istiod-local"), "pod-files", "--state-dir", str(state), "--namespace",
                        "default", "--service-account", "sleep", "--pod", "sleep-1", "--out", str(pod)],
                       check=True, capture_output=True, timeout=60, env=base_env())
        yield Istiod(state, proc, out, "localhost:" + secure.rpartition(":")[2])
    finally:
        stop_process(proc, grace=15)
        shutil.rmtree(state, ignore_errors=True)
        registry.unlink(missing_ok=True)


@dataclass
class Agent:
    proc: subprocess.Popen[str]
    out: LineCollector
    status_port: int
    output_certs: Path

    def ready(self) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.status_port}/healthz/ready", timeout=2) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def wait(self, timeout_seconds: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(VENV_BIN / "pilot-agent"), "wait", f"--url=http://localhost:{self.status_port}/healthz/ready",
             f"--timeoutSeconds={timeout_seconds}", "--periodMillis=100"],
            capture_output=True, text=True, timeout=timeout_seconds + 30, env=base_env())


def start_agent(pod: Path, ca_address: str) -> Agent:
    status_port = free_port()
    output_certs = pod / "var/lib/istio/data"
    environment = {
        **base_env(),
        # The grpc-agent injection template's environment.
        "ISTIO_META_GENERATOR": "grpc", "DISABLE_ENVOY": "true", "OUTPUT_CERTS": str(output_certs),
        "PILOT_CERT_PROVIDER": "istiod", "CA_ADDR": ca_address, "ISTIO_META_CLUSTER_ID": "Kubernetes",
        "TRUST_DOMAIN": "cluster.local", "POD_NAME": "sleep-1", "POD_NAMESPACE": "default",
        "SERVICE_ACCOUNT": "sleep", "INSTANCE_IP": "127.0.0.1",
        "PROXY_CONFIG": json.dumps({"discoveryAddress": ca_address, "statusPort": status_port}),
    }
    proc = subprocess.Popen([str(VENV_BIN / "pilot-agent"), *TEMPLATE_ARGS], cwd=pod, env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return Agent(proc, LineCollector(proc.stdout), status_port, output_certs)


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    started: list[Agent] = []
    yield started
    for agent in started:
        stop_process(agent.proc, grace=15)


def read_bootstrap(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, json.JSONDecodeError):
        return None


def test_proxyless_agent_bootstrap_readiness_and_grpc_xds_client(
        pod: Path, istiod: Istiod, agents: list[Agent]) -> None:
    agent = start_agent(pod, istiod.secure)
    agents.append(agent)
    path = pod / "etc/istio/proxy/grpc-bootstrap.json"  # GRPC_XDS_BOOTSTRAP's default, relative to the pod root
    bootstrap = poll(lambda: read_bootstrap(path), "the gRPC bootstrap to be written", on_timeout=agent.out.text)

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
    assert waited.returncode == 0, f"{waited.stdout}{waited.stderr}\n{agent.out.text()}"
    for name in ("cert-chain.pem", "key.pem", "root-cert.pem"):
        assert (agent.output_certs / name).is_file(), f"ready before {name} was written"
    assert agent.ready() == (200, "")

    assert istiod.ads_connections(NODE_ID) == [], "the agent alone must not have opened an ADS stream"
    client = subprocess.run(
        [str(VENV_BIN / "python"), "-c", XDS_CLIENT, "5"], capture_output=True, text=True, timeout=60,
        env={**base_env(), "GRPC_XDS_BOOTSTRAP": str(path)})
    context = f"client: {client.stdout}{client.stderr}\nistiod:\n{istiod.out.text()}\nagent:\n{agent.out.text()}"
    assert client.returncode == 0, context
    assert client.stdout.strip() == "RPC OK pong:ping", context
    connections = poll(lambda: istiod.ads_connections(NODE_ID), "istiod-local to log the client's ADS stream",
                       on_timeout=lambda: context)
    assert all("(generator grpc)" in line for line in connections), "GENERATOR: grpc reached istiod unchanged"
    assert agent.proc.poll() is None, agent.out.text()

    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(20) == 0, agent.out.text()
    assert path.exists(), "the bootstrap stays for the app after the agent stops"


def test_not_ready_while_the_certificates_are_missing(pod: Path, istiod: Istiod, agents: list[Agent]) -> None:
    unreachable = f"localhost:{free_port()}"  # no CA there: the certificate never arrives
    agent = start_agent(pod, unreachable)
    agents.append(agent)
    path = pod / "etc/istio/proxy/grpc-bootstrap.json"
    poll(lambda: read_bootstrap(path), "the gRPC bootstrap to be written", on_timeout=agent.out.text)

    def answered() -> tuple[int, str] | None:
        if agent.proc.poll() is not None:
            raise AssertionError(f"the agent exited:\n{agent.out.text()}")
        try:
            return agent.ready()
        except OSError:
            return None

    status, reason = poll(answered, "the status server to answer", on_timeout=agent.out.text)
    assert status == 503
    assert reason == f"{agent.output_certs / 'cert-chain.pem'} does not exist"
    waited = agent.wait(timeout_seconds=1)
    assert waited.returncode != 0
