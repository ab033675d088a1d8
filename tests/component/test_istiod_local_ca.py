"""istiod-local's CA over real gRPC (TLS and plaintext) on loopback, in-process on ephemeral ports."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from istio_agent.pki.certs import build_csr, load_pem_chain, not_after, uri_sans, verify_signed_by
from istio_agent.pki.keys import generate_key
from istio_agent.protos import istioca_pb2, istioca_pb2_grpc
from istiod_local.controlplane.server import ControlPlane, ControlPlaneOptions

SLEEP_ID = "spiffe://cluster.local/ns/default/sa/sleep"
SERVER_NAME = "istiod.istio-system.svc"


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    cp = ControlPlane(ControlPlaneOptions(tmp_path / "state", "127.0.0.1:0", "127.0.0.1:0", max_cert_ttl_seconds=3600))
    await cp.start()
    try:
        yield cp
    finally:
        await cp.stop()


def _tls_channel(cp: ControlPlane, server_name: str = SERVER_NAME) -> grpc.aio.Channel:
    creds = grpc.ssl_channel_credentials(root_certificates=cp.root_cert_pem.encode())
    return grpc.aio.secure_channel(cp.secure_address, creds, options=[("grpc.ssl_target_name_override", server_name)])


async def _call(
    channel: grpc.aio.Channel, csr: str, token: str | None, ttl: int = 600, cluster: str = "Kubernetes"
) -> istioca_pb2.IstioCertificateResponse:
    metadata = [("clusterid", cluster)]
    if token is not None:
        metadata.append(("authorization", f"Bearer {token}"))
    stub = istioca_pb2_grpc.IstioCertificateServiceStub(channel)
    request = istioca_pb2.IstioCertificateRequest(csr=csr, validity_duration=ttl)
    request.metadata.update({"CertSigner": ""})
    return await stub.CreateCertificate(request, metadata=metadata, timeout=10)


def _csr(*sans: str, algorithm: str = "ECDSA") -> str:
    return build_csr(generate_key(algorithm), list(sans)).decode()  # type: ignore[arg-type]


def _check_chain(cp: ControlPlane, response: istioca_pb2.IstioCertificateResponse, identity: str) -> x509.Certificate:
    assert len(response.cert_chain) == 2
    leaf, root = (load_pem_chain(pem)[0] for pem in response.cert_chain)
    assert root == load_pem_chain(cp.root_cert_pem)[0]
    assert uri_sans(leaf) == [identity]
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert len(list(san)) == 1
    assert verify_signed_by(leaf, root)
    return leaf


@pytest.mark.parametrize("algorithm", ["ECDSA", "RSA"])
async def test_tls_success_returns_leaf_then_root(plane: ControlPlane, algorithm: str) -> None:
    async with _tls_channel(plane) as channel:
        response = await _call(channel, _csr(SLEEP_ID, algorithm=algorithm), plane.mint_token("default", "sleep"))
    _check_chain(plane, response, SLEEP_ID)


async def test_tls_server_name_localhost_and_ip_verify_too(plane: ControlPlane) -> None:
    for name in ("localhost", "127.0.0.1"):
        async with _tls_channel(plane, name) as channel:
            response = await _call(channel, _csr(SLEEP_ID), plane.mint_token("default", "sleep"))
        _check_chain(plane, response, SLEEP_ID)


async def test_tls_wrong_server_name_is_refused_by_the_client(plane: ControlPlane) -> None:
    async with _tls_channel(plane, "evil.example") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _call(channel, _csr(SLEEP_ID), plane.mint_token("default", "sleep"))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_plaintext_success(plane: ControlPlane) -> None:
    async with grpc.aio.insecure_channel(plane.plain_address) as channel:
        response = await _call(channel, _csr("spiffe://cluster.local/ns/prod/sa/api"), plane.mint_token("prod", "api"))
    _check_chain(plane, response, "spiffe://cluster.local/ns/prod/sa/api")


async def test_another_service_accounts_token_is_permission_denied(
    plane: ControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "istiod_local.controlplane.ca")
    async with _tls_channel(plane) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _call(channel, _csr(SLEEP_ID), plane.mint_token("default", "other"))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "spiffe://cluster.local/ns/default/sa/other" in (info.value.details() or "")
    assert any("PERMISSION_DENIED" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("case", ["missing", "expired", "tampered", "foreign", "wrong-audience", "garbage"])
async def test_bad_tokens_are_unauthenticated(
    plane: ControlPlane, tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    caplog.set_level(logging.WARNING, "istiod_local.controlplane.ca")
    good = plane.mint_token("default", "sleep")
    token: str | None
    if case == "missing":
        token = None
    elif case == "expired":
        token = plane.mint_token("default", "sleep", ttl_seconds=60, now=time.time() - 3600)
    elif case == "tampered":
        head, payload, sig = good.split(".")
        token = f"{head}.{payload}.{sig[:-4]}{'AAAA' if sig[-4:] != 'AAAA' else 'BBBB'}"
    elif case == "foreign":
        async with ControlPlane(ControlPlaneOptions(tmp_path / "other", "127.0.0.1:0", "")) as other:
            token = other.mint_token("default", "sleep")
    elif case == "wrong-audience":
        token = plane.mint_token("default", "sleep", audiences=("kubernetes",))
    else:
        token = "x.y.z"
    async with _tls_channel(plane) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _call(channel, _csr(SLEEP_ID), token)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert info.value.details()
    assert any("UNAUTHENTICATED" in r.getMessage() for r in caplog.records)


async def test_malformed_csr_is_invalid_argument(plane: ControlPlane) -> None:
    async with grpc.aio.insecure_channel(plane.plain_address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _call(channel, "not a CSR", plane.mint_token("default", "sleep"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(("requested", "expected"), [(600, 600), (7200, 3600), (0, 3600), (-1, 3600)])
async def test_ttl_is_capped_by_max_cert_ttl(plane: ControlPlane, requested: int, expected: int) -> None:
    before = time.time()
    async with grpc.aio.insecure_channel(plane.plain_address) as channel:
        response = await _call(channel, _csr(SLEEP_ID), plane.mint_token("default", "sleep"), ttl=requested)
    after = time.time()
    leaf = _check_chain(plane, response, SLEEP_ID)
    assert int(before) + expected - 1 <= not_after(leaf) <= after + expected + 1


async def test_cluster_id_is_logged(plane: ControlPlane, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "istiod_local.controlplane.ca")
    async with grpc.aio.insecure_channel(plane.plain_address) as channel:
        await _call(channel, _csr(SLEEP_ID), plane.mint_token("default", "sleep", pod="sleep-1"), cluster="Kube-7")
    lines = [r.getMessage() for r in caplog.records if "issued" in r.getMessage()]
    assert lines and "Kube-7" in lines[0] and SLEEP_ID in lines[0] and "sleep-1" in lines[0]


async def test_extra_services_share_the_ports(tmp_path: Path) -> None:
    """A second service (standing in for ADS) registered on the same ports is served on both."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    health_servicer = health.aio.HealthServicer()
    cp = ControlPlane(ControlPlaneOptions(tmp_path / "state", "127.0.0.1:0", "127.0.0.1:0"))
    cp.add_service(lambda server: health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server))
    async with cp:
        await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        for channel in (grpc.aio.insecure_channel(cp.plain_address), _tls_channel(cp)):
            async with channel:
                reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(RuntimeError):
            cp.add_service(lambda server: None)
