"""A real `istiod-local serve` subprocess on fixed free loopback ports, for the identity tests.

Fixed ports (not port 0) so that a test can stop the CA and start it again at
the same address, as a restarted istiod would come back.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import grpc
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.secret.v3 import sds_pb2_grpc
from support import free_port, stop_process

from istio_agent.pki import certs
from istio_agent.security.options import SecurityOptions

ROOT = Path(__file__).resolve().parents[2]
ISTIOD_LOCAL = ROOT / ".venv" / "bin" / "istiod-local"
SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
NODE_ID = "sidecar~127.0.0.1~sleep-1.default~default.svc.cluster.local"


class Istiod:
    """`istiod-local serve` with its state dir; start/stop/restart at the same addresses."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.plain_port = free_port()
        self.secure_port = free_port()
        self.log = state.parent / f"{state.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def secure_address(self) -> str:
        return f"localhost:{self.secure_port}"

    def start(self, timeout: float = 30.0) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(ISTIOD_LOCAL), "serve", "--state-dir", str(self.state),
                 "--grpc-addr", f"127.0.0.1:{self.plain_port}",
                 "--secure-grpc-addr", f"127.0.0.1:{self.secure_port}"],
                stdout=subprocess.DEVNULL, stderr=log,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"istiod-local exited: {self.log.read_text()}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.secure_port)) == 0:
                    return
            time.sleep(0.05)
        raise AssertionError(f"istiod-local did not listen: {self.log.read_text()}")

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None

    def _run(self, *args: str) -> str:
        done = subprocess.run([str(ISTIOD_LOCAL), *args, "--state-dir", str(self.state)],
                              capture_output=True, text=True, timeout=60, check=True)
        return done.stdout

    def pod_files(self, pod: Path, namespace: str = "default", service_account: str = "sleep") -> None:
        self._run("pod-files", "--namespace", namespace, "--service-account", service_account,
                  "--pod", "sleep-1", "--out", str(pod))

    def token(self, namespace: str = "default", service_account: str = "sleep", ttl: str = "1h") -> str:
        return self._run("token", "--namespace", namespace, "--service-account", service_account,
                         "--token-ttl", ttl).strip()

    def root_pem(self, pod: Path) -> bytes:
        return (pod / "var/run/secrets/istio/root-cert.pem").read_bytes()


def token_path(pod: Path) -> Path:
    return pod / "var/run/secrets/tokens/istio-token"


def token_expiry(token: str) -> float:
    payload = token.split(".")[1]
    return float(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["exp"])


def pod_options(pod: Path, istiod: Istiod, **overrides: object) -> SecurityOptions:
    values: dict[str, object] = dict(
        workdir=pod, namespace="default", service_account="sleep", ca_address=istiod.secure_address,
        secret_ttl=6.0, grace_period_ratio=0.5, grace_period_ratio_jitter=0.0,
        retry_initial=0.1, retry_max=0.5, file_poll_interval=0.1, key_algorithm="ECDSA",
    )
    values.update(overrides)
    return SecurityOptions(**values)  # type: ignore[arg-type]


def leaf_of(chain_pem: bytes) -> certs.x509.Certificate:
    return certs.load_pem_chain(chain_pem)[0]


class SdsClient:
    """One StreamSecrets stream to the agent's UDS, driven request by request like Envoy does."""

    def __init__(self, socket_path: Path) -> None:
        # Reach long paths through a directory descriptor held for the stream's lifetime.
        self._dir_fd = os.open(socket_path.parent, os.O_RDONLY | os.O_DIRECTORY)
        self.channel = grpc.aio.insecure_channel(f"unix:/proc/self/fd/{self._dir_fd}/{socket_path.name}")
        self.stub = sds_pb2_grpc.SecretDiscoveryServiceStub(self.channel)
        self.call = self.stub.StreamSecrets()

    async def request(self, names: list[str], nonce: str = "", error: str | None = None,
                      node: bool = True) -> None:
        request = discovery_pb2.DiscoveryRequest(type_url=SECRET_TYPE, resource_names=names, response_nonce=nonce)
        if node:
            request.node.id = NODE_ID
        if error is not None:
            request.error_detail.code = 3
            request.error_detail.message = error
        await self.call.write(request)

    async def read(self, timeout: float = 20.0) -> discovery_pb2.DiscoveryResponse:
        response = await asyncio.wait_for(self.call.read(), timeout)
        assert response is not grpc.aio.EOF, "stream ended"
        assert isinstance(response, discovery_pb2.DiscoveryResponse)
        return response

    async def close(self) -> None:
        self.call.cancel()
        await self.channel.close()
        os.close(self._dir_fd)


def secrets_of(response: discovery_pb2.DiscoveryResponse) -> dict[str, secret_pb2.Secret]:
    out: dict[str, secret_pb2.Secret] = {}
    for resource in response.resources:
        assert resource.type_url == SECRET_TYPE
        secret = secret_pb2.Secret()
        resource.Unpack(secret)
        out[secret.name] = secret
    return out

