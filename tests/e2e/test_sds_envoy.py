"""The real Envoy takes its TLS identity from the agent's SDS server.

A static bootstrap puts a TLS listener on loopback whose certificate is SDS
`default` and whose client validation is SDS `ROOTCA`, both fetched over the
agent's Unix socket. A Python TLS client presents a certificate istiod-local
issued to another service account. The served certificate must carry the
workload's SPIFFE id, must change after a rotation without restarting Envoy,
and must stay in service while the CA is down.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from support import free_port, stop_process

from istio_agent.pki import certs, keys
from istio_agent.security.ca_client import CaClient
from istio_agent.security.identity import WorkloadIdentity
from istio_agent.security.options import SecurityOptions

ROOT = Path(__file__).resolve().parents[2]
ENVOY = ROOT / ".venv" / "bin" / "envoy"
ISTIOD_LOCAL = ROOT / ".venv" / "bin" / "istiod-local"
SPIFFE = "spiffe://cluster.local/ns/default/sa/sleep"
CLIENT_SPIFFE = "spiffe://cluster.local/ns/default/sa/client"
DOWNSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"


def wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"process exited: {log.read_text()}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}: {log.read_text()}")


class Istiod:
    """`istiod-local serve` on fixed free ports, restartable at the same address."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.plain_port, self.secure_port = free_port(), free_port()
        self.log = state.parent / "istiod.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(ISTIOD_LOCAL), "serve", "--state-dir", str(self.state),
                 "--grpc-addr", f"127.0.0.1:{self.plain_port}", "--secure-grpc-addr", f"127.0.0.1:{self.secure_port}"],
                stdout=subprocess.DEVNULL, stderr=log,
            )
        wait_for_port(self.secure_port, self.proc, self.log)

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None

    def pod_files(self, pod: Path, service_account: str) -> None:
        subprocess.run([str(ISTIOD_LOCAL), "pod-files", "--state-dir", str(self.state), "--namespace", "default",
                        "--service-account", service_account, "--out", str(pod)],
                       check=True, capture_output=True, timeout=60)


@dataclass
class Mesh:
    workdir: Path
    istiod: Istiod
    pod: Path
    client_dir: Path


@pytest.fixture
def mesh() -> Iterator[Mesh]:
    # A short directory: Envoy's pipe address must fit in a Unix socket path.
    workdir = Path(tempfile.mkdtemp(prefix="sds-e2e-", dir="/tmp"))
    istiod = Istiod(workdir / "state")
    try:
        istiod.start()
        pod, client_dir = workdir / "pod", workdir / "client"
        istiod.pod_files(pod, "sleep")
        istiod.pod_files(client_dir, "client")
        yield Mesh(workdir, istiod, pod, client_dir)
    finally:
        istiod.stop()
        shutil.rmtree(workdir, ignore_errors=True)


async def issue_client_cert(mesh: Mesh) -> tuple[Path, Path, Path]:
    """A client certificate for another service account, obtained from istiod-local like a peer would."""
    options = SecurityOptions(workdir=mesh.client_dir, namespace="default", service_account="client",
                              ca_address=f"localhost:{mesh.istiod.secure_port}")
    key = keys.generate_key("ECDSA")
    client = CaClient(options)
    try:
        chain = await client.sign(certs.build_csr(key, [CLIENT_SPIFFE]), 3600)
    finally:
        await client.close()
    cert_file, key_file = mesh.client_dir / "cert.pem", mesh.client_dir / "key.pem"
    cert_file.write_text("".join(chain[:-1]))
    key_file.write_bytes(keys.key_to_pem(key))
    return cert_file, key_file, mesh.client_dir / "var/run/secrets/istio/root-cert.pem"


def foreign_client_cert(mesh: Mesh) -> tuple[Path, Path, Path]:
    """A client certificate from a CA Envoy's ROOTCA does not hold: must be refused."""
    other = certs.new_root_ca(keys.generate_key("ECDSA"), "cluster.local", time.time(), 3600)
    key = keys.generate_key("ECDSA")
    leaf = certs.sign_workload_csr(other, certs.load_csr(certs.build_csr(key, [CLIENT_SPIFFE])), CLIENT_SPIFFE,
                                   time.time(), 3600)
    cert_file, key_file = mesh.workdir / "stranger.pem", mesh.workdir / "stranger-key.pem"
    cert_file.write_text(certs.cert_to_pem(leaf))
    key_file.write_bytes(keys.key_to_pem(key))
    return cert_file, key_file, mesh.client_dir / "var/run/secrets/istio/root-cert.pem"


def sds_config() -> dict[str, object]:
    return {
        "resource_api_version": "V3",
        "api_config_source": {
            "api_type": "GRPC", "transport_api_version": "V3",
            "grpc_services": [{"envoy_grpc": {"cluster_name": "sds-grpc"}}],
        },
    }


def bootstrap(socket_path: Path, listener_port: int, admin_port: int) -> dict[str, object]:
    return {
        "node": {"id": "sidecar~127.0.0.1~sleep-1.default~default.svc.cluster.local", "cluster": "sleep.default"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "clusters": [{
                "name": "sds-grpc",
                "type": "STATIC",
                "connect_timeout": "1s",
                "typed_extension_protocol_options": {
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                        "explicit_http_config": {"http2_protocol_options": {}},
                    },
                },
                "load_assignment": {
                    "cluster_name": "sds-grpc",
                    "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": str(socket_path)}}}}]}],
                },
            }],
            "listeners": [{
                "name": "mtls",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": listener_port}},
                "filter_chains": [{
                    "transport_socket": {
                        "name": "envoy.transport_sockets.tls",
                        "typed_config": {
                            "@type": DOWNSTREAM_TLS,
                            "require_client_certificate": True,
                            "common_tls_context": {
                                "tls_certificate_sds_secret_configs": [{"name": "default", "sds_config": sds_config()}],
                                "validation_context_sds_secret_config": {"name": "ROOTCA", "sds_config": sds_config()},
                            },
                        },
                    },
                    "filters": [{
                        "name": "envoy.filters.network.echo",
                        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.network.echo.v3.Echo"},
                    }],
                }],
            }],
        },
    }


@dataclass
class RunningEnvoy:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path


@pytest.fixture
async def envoy_for(mesh: Mesh) -> AsyncIterator[list[RunningEnvoy]]:
    started: list[RunningEnvoy] = []
    yield started
    for envoy in started:
        stop_process(envoy.proc)


def start_envoy(mesh: Mesh, socket_path: Path) -> RunningEnvoy:
    port, admin = free_port(), free_port()
    config = mesh.workdir / "envoy.json"
    config.write_text(json.dumps(bootstrap(socket_path, port, admin)))
    log = mesh.workdir / "envoy.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(ENVOY), "-c", str(config), "--disable-hot-restart", "--base-id", str(random.randint(1, 1 << 30)),
             "-l", "warning", "--concurrency", "1"],
            stdout=out, stderr=out,
        )
    return RunningEnvoy(proc, port, log)


def handshake(port: int, client: tuple[Path, Path, Path]) -> x509.Certificate:
    """One mTLS connection: the certificate Envoy presented (after checking data flows both ways)."""
    cert_file, key_file, root_file = client
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # workload identities are SPIFFE URIs, not DNS names
    context.load_verify_locations(str(root_file))
    context.load_cert_chain(str(cert_file), str(key_file))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
        # With TLS 1.3 Envoy checks our certificate after the handshake: only an echo proves it accepted us.
        tls.sendall(b"ping\n")
        assert tls.recv(64) == b"ping\n", "Envoy closed the connection (client certificate rejected?)"
    assert der is not None
    return x509.load_der_x509_certificate(der)


async def served_certificate(envoy: RunningEnvoy, client: tuple[Path, Path, Path],
                             timeout: float = 30.0) -> x509.Certificate:
    """Poll until Envoy's listener completes an mTLS handshake (it waits for both SDS secrets)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if envoy.proc.poll() is not None:
            raise AssertionError(f"envoy exited: {envoy.log.read_text()}")
        try:
            return await asyncio.to_thread(handshake, envoy.port, client)
        except (OSError, ssl.SSLError) as exc:
            last = exc
            await asyncio.sleep(0.1)
    raise AssertionError(f"no mTLS handshake with envoy: {last}; log: {envoy.log.read_text()}")


async def until_new_serial(envoy: RunningEnvoy, client: tuple[Path, Path, Path], old: int,
                           timeout: float = 30.0) -> x509.Certificate:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cert = await served_certificate(envoy, client)
        if cert.serial_number != old:
            return cert
        await asyncio.sleep(0.2)
    raise AssertionError("Envoy kept serving the old certificate")


def identity_options(mesh: Mesh, **overrides: object) -> SecurityOptions:
    values: dict[str, object] = dict(
        workdir=mesh.pod, namespace="default", service_account="sleep",
        ca_address=f"localhost:{mesh.istiod.secure_port}", key_algorithm="ECDSA", grace_period_ratio_jitter=0.0,
        retry_initial=0.1, retry_max=0.5,
    )
    values.update(overrides)
    return SecurityOptions(**values)  # type: ignore[arg-type]


async def test_envoy_serves_sds_certificate_and_picks_up_rotation(
    mesh: Mesh, envoy_for: list[RunningEnvoy]
) -> None:
    identity = WorkloadIdentity(identity_options(mesh, secret_ttl=8.0, grace_period_ratio=0.5))
    await identity.start()
    try:
        client = await issue_client_cert(mesh)
        envoy = start_envoy(mesh, identity.options.sds_socket_path)
        envoy_for.append(envoy)
        first = await served_certificate(envoy, client)
        assert certs.uri_sans(first) == [SPIFFE]
        root = certs.load_pem_chain(client[2].read_bytes())[0]
        assert certs.verify_signed_by(first, root)
        stranger = foreign_client_cert(mesh)
        with pytest.raises((OSError, AssertionError)):
            await asyncio.to_thread(handshake, envoy.port, stranger)

        rotated = await until_new_serial(envoy, client, first.serial_number)
        assert certs.uri_sans(rotated) == [SPIFFE]
        assert envoy.proc.poll() is None, "same Envoy process: rotated without a restart"
        assert time.time() < certs.not_after(first), "rotated before the first certificate expired"
    finally:
        await identity.stop()


async def test_envoy_keeps_its_certificate_while_the_ca_is_down(
    mesh: Mesh, envoy_for: list[RunningEnvoy], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="istio_agent.security")
    identity = WorkloadIdentity(identity_options(mesh, secret_ttl=12.0, grace_period_ratio=0.8))
    await identity.start()
    try:
        client = await issue_client_cert(mesh)
        envoy = start_envoy(mesh, identity.options.sds_socket_path)
        envoy_for.append(envoy)
        first = await served_certificate(envoy, client)

        mesh.istiod.stop()
        deadline = time.monotonic() + 30
        while not any("keeping the current certificate" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "no failed rotation while the CA was down"
            await asyncio.sleep(0.05)
        during = await served_certificate(envoy, client)
        if time.time() < certs.not_after(first) - 1:
            assert during.serial_number == first.serial_number, "Envoy keeps its certificate during the outage"

        mesh.istiod.start()
        rotated = await until_new_serial(envoy, client, first.serial_number)
        assert certs.uri_sans(rotated) == [SPIFFE]
        assert envoy.proc.poll() is None
    finally:
        await identity.stop()
