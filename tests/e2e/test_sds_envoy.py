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
from launchers import IstiodLocal
from needs import need_file
from support import ENVOY, eventually, free_port, stop_process

from istio_agent.pki import certs, keys
from istio_agent.security.ca_client import CaClient
from istio_agent.security.identity import WorkloadIdentity
from istio_agent.security.options import SecurityOptions

SPIFFE = "spiffe://cluster.local/ns/default/sa/sleep"
CLIENT_SPIFFE = "spiffe://cluster.local/ns/default/sa/client"
DOWNSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"


@pytest.fixture
def registry() -> None:
    """istiod-local's CA alone: these tests need certificates, not xDS."""
    return None


@dataclass
class Mesh:
    workdir: Path
    istiod: IstiodLocal
    pod: Path
    client_dir: Path


@pytest.fixture
def mesh(istiod: IstiodLocal) -> Iterator[Mesh]:
    need_file(ENVOY)
    # A short directory: Envoy's pipe address must fit in a Unix socket path.
    workdir = Path(tempfile.mkdtemp(prefix="sds-e2e-", dir="/tmp"))
    try:
        pod = istiod.pod_files(workdir / "pod", service_account="sleep")
        client_dir = istiod.pod_files(workdir / "client", service_account="client")
        yield Mesh(workdir, istiod, pod, client_dir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def issue_client_cert(mesh: Mesh) -> tuple[Path, Path, Path]:
    """A client certificate for another service account, obtained from istiod-local like a peer would."""
    options = SecurityOptions(workdir=mesh.client_dir, namespace="default", service_account="client",
                              ca_address=mesh.istiod.secure_address)
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
    async def handshaken() -> x509.Certificate:
        if envoy.proc.poll() is not None:
            raise AssertionError(f"envoy exited: {envoy.log.read_text()}")
        return await asyncio.to_thread(handshake, envoy.port, client)

    certificate: x509.Certificate = await eventually(
        handshaken, "an mTLS handshake with Envoy", timeout, envoy.log.read_text, interval=0.1,
        retry_on=(OSError, ssl.SSLError))
    return certificate


async def until_serial_changes(envoy: RunningEnvoy, client: tuple[Path, Path, Path], old: int,
                               timeout: float = 30.0) -> x509.Certificate:
    async def changed() -> x509.Certificate | None:
        cert = await served_certificate(envoy, client)
        return cert if cert.serial_number != old else None

    certificate: x509.Certificate = await eventually(changed, "Envoy to serve a new certificate", timeout,
                                                     interval=0.2)
    return certificate


def identity_options(mesh: Mesh, **overrides: object) -> SecurityOptions:
    values: dict[str, object] = dict(
        workdir=mesh.pod, namespace="default", service_account="sleep",
        ca_address=mesh.istiod.secure_address, key_algorithm="ECDSA", grace_period_ratio_jitter=0.0,
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

        rotated = await until_serial_changes(envoy, client, first.serial_number)
        assert certs.uri_sans(rotated) == [SPIFFE]
        assert envoy.proc.poll() is None, "same Envoy process: rotated without a restart"
        # Read from the certificates, not the clock: the served one was issued (notBefore is backdated by
        # BACKDATE) while the first was still valid, i.e. rotated at the grace period, not at expiry.
        issued = certs.not_before(rotated) + certs.BACKDATE.total_seconds()
        assert issued < certs.not_after(first), "rotated only once the first certificate had expired"
    finally:
        await identity.stop()


async def test_envoy_keeps_its_certificate_while_the_ca_is_down(
    mesh: Mesh, envoy_for: list[RunningEnvoy], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="istio_agent.security")
    # Rotation is due 3 s after issue (1 % of 300 s), while the certificate stays valid for minutes: longer than
    # the whole test, so "still valid" holds at every check below without looking at the clock.
    identity = WorkloadIdentity(identity_options(mesh, secret_ttl=300.0, grace_period_ratio=0.99))
    await identity.start()
    try:
        client = await issue_client_cert(mesh)
        envoy = start_envoy(mesh, identity.options.sds_socket_path)
        envoy_for.append(envoy)
        await served_certificate(envoy, client)

        mesh.istiod.stop()
        await eventually(lambda: any("keeping the current certificate" in r.getMessage() for r in caplog.records),
                         "a failed rotation while the CA is down", 30)
        # What the agent holds now (the first certificate, or its rotation if that beat the outage) stays.
        kept = identity.cache.current_workload()
        assert kept is not None, "the cached certificate was dropped while the CA is down"
        kept_serial = certs.load_pem_chain(kept.cert_chain)[0].serial_number
        during = await served_certificate(envoy, client)
        assert during.serial_number == kept_serial, "Envoy keeps its certificate during the outage"

        mesh.istiod.start()
        rotated = await until_serial_changes(envoy, client, kept_serial)
        assert certs.uri_sans(rotated) == [SPIFFE]
        assert envoy.proc.poll() is None
    finally:
        await identity.stop()
