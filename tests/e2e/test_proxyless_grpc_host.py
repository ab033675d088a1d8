"""Proxyless gRPC against istiod-local's `grpc` generator, with grpcio's own xDS client and server.

On the host, no agent: istiod-local serves ADS on loopback; each side gets a
hand-written gRPC bootstrap (node id, `GENERATOR: grpc`, a `file_watcher`
certificate provider over certificates minted from istiod-local's own CA)
and runs in its own process, because GRPC_XDS_BOOTSTRAP is process-wide.
The server is `grpc.server(..., xds=True)` with `xds_server_credentials`;
the client dials `xds:///greeter.default.svc.cluster.local:50051` with
`xds_channel_credentials`. Everything they do comes from xDS: the service
port 50051 exists only in the registry (the endpoint is the server's real
port), and whether they speak mTLS comes from the generated clusters and
server listeners, the insecure fallback credentials being used otherwise.

What the server reports back (the peer's SPIFFE id from its auth context)
shows mTLS really happened; a plain `insecure_channel` to the server's port
shows what PeerAuthentication lets in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from launchers import IstiodLocal, RegistryFile
from support import LineCollector, free_port, stop_process

from istio_agent.pki.certs import build_csr, cert_to_pem, load_csr, sign_workload_csr
from istio_agent.pki.keys import generate_key, key_to_pem
from istiod_local.controlplane.state import load_or_create_state

SERVICE_PORT = 50051
TARGET = f"xds:///greeter.default.svc.cluster.local:{SERVICE_PORT}"
METHOD = "/test.Greeter/Hello"
CLIENT_ID = "spiffe://cluster.local/ns/default/sa/sleep"
SERVER_ID = "spiffe://cluster.local/ns/default/sa/greeter"
RPC_DEADLINE = 20.0

REGISTRY = """
services:
- name: greeter
  selector: {{app: greeter}}
  ports: [{{name: grpc, port: {service_port}, targetPort: {port}, protocol: GRPC}}]
workloads:
- {{name: greeter-1, serviceAccount: greeter, labels: {{app: greeter}}, ip: 127.0.0.1}}
- {{name: sleep-1, serviceAccount: sleep, labels: {{app: sleep}}, ip: 127.0.0.2}}
peerAuthentication: {{default: {mode}}}
"""

SERVER_APP = """
import json, sys
from concurrent import futures
import grpc

def hello(request, context):
    auth = {k: [v.decode(errors="replace") for v in vs] for k, vs in context.auth_context().items()}
    ids = [i.decode() for i in (context.peer_identities() or [])]
    return json.dumps({"auth": auth, "identities": ids}).encode()

handler = grpc.method_handlers_generic_handler("test.Greeter", {"Hello": grpc.unary_unary_rpc_method_handler(hello)})
server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[handler], xds=True)
server.add_secure_port(sys.argv[1], grpc.xds_server_credentials(grpc.insecure_server_credentials()))
server.start()
server.wait_for_termination()
"""

CLIENT_APP = """
import sys
import grpc
import grpc.experimental

creds = grpc.xds_channel_credentials(fallback_credentials=grpc.experimental.insecure_channel_credentials())
with grpc.secure_channel(sys.argv[1], creds) as channel:
    reply = channel.unary_unary(sys.argv[2])(b"hi", timeout=float(sys.argv[3]), wait_for_ready=True)
print(reply.decode())
"""


class Process:
    """A child process whose stderr is collected (for failure messages) and which is always reaped."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.err = LineCollector(self.proc.stderr)

    def stderr(self) -> str:
        return self.err.tail(60)

    def stop(self) -> None:
        stop_process(self.proc)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def _mint(state: Any, spiffe: str, folder: Path) -> dict[str, str]:
    """Certificates as the agent's OUTPUT_CERTS holds them, signed by istiod-local's root."""
    folder.mkdir(parents=True)
    key = generate_key("ECDSA")
    leaf = sign_workload_csr(state.ca, load_csr(build_csr(key, [spiffe])), spiffe, time.time(), 3600)
    files = {"certificate_file": folder / "cert-chain.pem", "private_key_file": folder / "key.pem",
             "ca_certificate_file": folder / "root-cert.pem"}
    files["certificate_file"].write_text(cert_to_pem(leaf))
    files["private_key_file"].write_bytes(key_to_pem(key))
    files["ca_certificate_file"].write_text(state.root_cert_pem)
    return {k: str(v) for k, v in files.items()}


def _bootstrap(path: Path, xds_address: str, node_id: str, certs: dict[str, str]) -> Path:
    bootstrap = {
        "xds_servers": [{"server_uri": xds_address, "channel_creds": [{"type": "insecure"}],
                         "server_features": ["xds_v3"]}],
        "node": {"id": node_id, "metadata": {"GENERATOR": "grpc"}, "locality": {}},
        "certificate_providers": {"default": {"plugin_name": "file_watcher", "config": {
            **certs, "refresh_interval": "900s"}}},
        "server_listener_resource_name_template": "xds.istio.io/grpc/lds/inbound/%s",
    }
    path.write_text(json.dumps(bootstrap, indent=2))
    return path


class Mesh:
    def __init__(self, tmp: Path, istiod: IstiodLocal, port: int) -> None:
        self.tmp, self.istiod, self.port = tmp, istiod, port
        self.state = load_or_create_state(istiod.state_dir, "cluster.local", time.time())
        self.processes: list[Process] = []
        self.xds = istiod.plaintext

    def _start(self, argv: list[str], env: dict[str, str] | None = None) -> Process:
        process = Process(argv, env)
        self.processes.append(process)
        return process

    def _env(self, name: str, node_id: str, spiffe: str) -> dict[str, str]:
        certs = _mint(self.state, spiffe, self.tmp / name / "certs")
        path = _bootstrap(self.tmp / name / "grpc-bootstrap.json", self.xds, node_id, certs)
        return {"GRPC_XDS_BOOTSTRAP": str(path), "GRPC_VERBOSITY": "ERROR"}

    def start_server(self) -> Process:
        env = self._env("greeter", "sidecar~127.0.0.1~greeter-1.default~default.svc.cluster.local", SERVER_ID)
        return self._start([sys.executable, "-c", SERVER_APP, f"127.0.0.1:{self.port}"], env)

    def call(self, target: str = TARGET) -> dict[str, Any]:
        """One RPC from a fresh proxyless client process; the server's report of what it saw."""
        env = self._env(f"sleep-{len(self.processes)}", "sidecar~127.0.0.2~sleep-1.default~default.svc.cluster.local",
                        CLIENT_ID)
        client = self._start([sys.executable, "-c", CLIENT_APP, target, METHOD, str(RPC_DEADLINE)], env)
        try:
            assert client.proc.stdout is not None
            out = client.proc.stdout.read()
            client.proc.wait(RPC_DEADLINE + 10)
        finally:
            client.stop()
        assert client.proc.returncode == 0, f"client failed:\n{client.stderr()}\nistiod:\n{self.istiod.log.tail(60)}"
        result: dict[str, Any] = json.loads(out)
        return result

    def plaintext_call(self) -> grpc.StatusCode | None:
        """A client outside the mesh: plain HTTP/2 straight to the server's port."""
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            try:
                channel.unary_unary(METHOD)(b"hi", timeout=10)
            except grpc.RpcError as exc:
                code: grpc.StatusCode = exc.code()
                return code
        return None

    def nacks(self) -> list[str]:
        return [line for line in self.istiod.lines if "NACK" in line]

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()


@pytest.fixture
def server_port() -> int:
    """The greeter's real port: the registry's targetPort, reached only through xDS."""
    return free_port()


@pytest.fixture
def registry(tmp_path: Path, mode: str, server_port: int) -> RegistryFile:
    """The greeter service in PeerAuthentication `mode` (the test's parameter), served by the `istiod` fixture."""
    return RegistryFile(tmp_path / "mesh.yaml", REGISTRY.format(service_port=SERVICE_PORT, port=server_port,
                                                                mode=mode))


@pytest.fixture
def mesh(tmp_path: Path, istiod: IstiodLocal, server_port: int) -> Iterator[Mesh]:
    running = Mesh(tmp_path, istiod, server_port)
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.parametrize("mode", ["STRICT", "PERMISSIVE"])
def test_rpc_over_mtls_shows_the_client_identity_and_plaintext_is_refused(mesh: Mesh) -> None:
    server = mesh.start_server()
    seen = mesh.call()
    assert seen["identities"] == [CLIENT_ID], seen
    assert seen["auth"]["transport_security_type"] == ["tls"]
    assert CLIENT_ID in seen["auth"]["x509_subject_alternative_name"]
    # gRPC servers cannot sniff TLS, so a mesh pod serves mTLS only, PERMISSIVE included (as upstream).
    assert mesh.plaintext_call() == grpc.StatusCode.UNAVAILABLE
    # The server is still serving mesh clients, also those dialling a short name.
    assert server.proc.poll() is None
    assert mesh.call(f"xds:///greeter:{SERVICE_PORT}")["identities"] == [CLIENT_ID]
    assert mesh.nacks() == []


@pytest.mark.parametrize("mode", ["DISABLE"])
def test_disable_means_plaintext_both_ways(mesh: Mesh) -> None:
    mesh.start_server()
    seen = mesh.call()
    assert seen["identities"] == [], seen
    assert seen["auth"].get("transport_security_type") != ["tls"], seen
    assert not any("spiffe://" in value for values in seen["auth"].values() for value in values), seen
    assert mesh.plaintext_call() is None
    assert mesh.nacks() == []
