"""The CA client on real sockets.

TLS, server-name and token rules are checked against a real istiod-local. The
retry policy needs a CA that fails on demand (UNAVAILABLE three times, a short
chain), which no real CA does, so a scripted IstioCertificateService on
loopback plays that part and records what it received.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from launchers import IstiodLocal
from security_harness import pod_options, sleep_pod, token_path

from istio_agent.pki import certs, keys
from istio_agent.protos import istioca_pb2, istioca_pb2_grpc
from istio_agent.security.ca_client import CaClient, CaError
from istio_agent.security.options import SecurityOptions

SPIFFE = "spiffe://cluster.local/ns/default/sa/sleep"


def csr() -> bytes:
    return certs.build_csr(keys.generate_key("ECDSA"), [SPIFFE])


async def test_tls_with_mounted_root_and_localhost_name(tmp_path: Path, istiod: IstiodLocal) -> None:
    pod = tmp_path / "pod"
    sleep_pod(istiod, pod)
    client = CaClient(pod_options(pod, istiod))
    try:
        chain = await client.sign(csr(), 600)
    finally:
        await client.close()
    assert len(chain) == 2
    leaf = certs.load_pem_chain(chain[0])[0]
    assert certs.uri_sans(leaf) == [SPIFFE]
    assert chain[-1].encode() == istiod.root_pem()


async def test_plaintext_port(tmp_path: Path, istiod: IstiodLocal) -> None:
    pod = tmp_path / "pod"
    sleep_pod(istiod, pod)
    client = CaClient(pod_options(pod, istiod, ca_address=f"127.0.0.1:{istiod.plaintext_port}", ca_plaintext=True))
    try:
        assert len(await client.sign(csr(), 600)) == 2
        token_path(pod).write_text(istiod.token(service_account="other"))
        with pytest.raises(CaError) as refused:
            await client.sign(csr(), 600)
        assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await client.close()


async def test_wrong_server_name_fails_tls(tmp_path: Path, istiod: IstiodLocal) -> None:
    pod = tmp_path / "pod"
    sleep_pod(istiod, pod)
    client = CaClient(pod_options(pod, istiod, istiod_san="not-istiod.example", ca_call_timeout=2.0))
    try:
        with pytest.raises(CaError) as failed:
            await client.sign(csr(), 600)
        assert failed.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        await client.close()


class ScriptedCa(istioca_pb2_grpc.IstioCertificateServiceServicer):
    """Answers from a script of status codes; records each call's metadata."""

    def __init__(self) -> None:
        self.script: list[grpc.StatusCode | str] = []
        self.calls: list[dict[str, str]] = []
        self.ca = certs.new_root_ca(keys.generate_key("ECDSA"), "cluster.local", time.time(), 3600)

    async def CreateCertificate(
        self, request: istioca_pb2.IstioCertificateRequest, context: grpc.aio.ServicerContext
    ) -> istioca_pb2.IstioCertificateResponse:
        self.calls.append({k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)})
        step = self.script.pop(0) if self.script else "ok"
        if isinstance(step, grpc.StatusCode):
            await context.abort(step, f"scripted {step.name}")
        leaf = certs.sign_workload_csr(self.ca, certs.load_csr(request.csr), SPIFFE, time.time(),
                                       request.validity_duration)
        chain = [certs.cert_to_pem(leaf)] if step == "short" else [certs.cert_to_pem(leaf), self.ca.cert_pem.decode()]
        return istioca_pb2.IstioCertificateResponse(cert_chain=chain)


@pytest.fixture
async def scripted(tmp_path: Path) -> AsyncIterator[tuple[ScriptedCa, SecurityOptions]]:
    servicer = ScriptedCa()
    server = grpc.aio.server()
    istioca_pb2_grpc.add_IstioCertificateServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    (tmp_path / "var/run/secrets/tokens").mkdir(parents=True)
    token_path(tmp_path).write_text("token-1\n")
    options = SecurityOptions(
        workdir=tmp_path, namespace="default", service_account="sleep", cluster_id="east",
        ca_address=f"127.0.0.1:{port}", ca_plaintext=True, ca_headers=(("x-tenant", "blue"),),
    )
    yield servicer, options
    await server.stop(None)


async def no_sleep(_: float) -> None:
    return None


async def test_retries_transient_codes_then_succeeds(scripted: tuple[ScriptedCa, SecurityOptions]) -> None:
    servicer, options = scripted
    servicer.script = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL]
    client = CaClient(options, sleep=no_sleep)
    try:
        chain = await client.sign(csr(), 600)
    finally:
        await client.close()
    assert len(chain) == 2
    assert len(servicer.calls) == 4
    first = servicer.calls[0]
    assert first["clusterid"] == "east"
    assert first["x-tenant"] == "blue"
    assert first["authorization"] == "Bearer token-1"


async def test_gives_up_after_five_calls(scripted: tuple[ScriptedCa, SecurityOptions]) -> None:
    servicer, options = scripted
    servicer.script = [grpc.StatusCode.UNAVAILABLE] * 10
    delays: list[float] = []

    async def record(delay: float) -> None:
        delays.append(delay)

    client = CaClient(options, sleep=record, rand=lambda: 0.5)
    try:
        with pytest.raises(CaError) as failed:
            await client.sign(csr(), 600)
    finally:
        await client.close()
    assert failed.value.code == grpc.StatusCode.UNAVAILABLE
    assert len(servicer.calls) == 5
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8])


async def test_refusals_are_not_retried_and_token_is_reread(
    scripted: tuple[ScriptedCa, SecurityOptions], tmp_path: Path
) -> None:
    servicer, options = scripted
    servicer.script = [grpc.StatusCode.PERMISSION_DENIED]
    client = CaClient(options, sleep=no_sleep)
    try:
        with pytest.raises(CaError, match="PERMISSION_DENIED: scripted PERMISSION_DENIED"):
            await client.sign(csr(), 600)
        assert len(servicer.calls) == 1
        token_path(tmp_path).write_text("token-2")
        await client.sign(csr(), 600)
        assert servicer.calls[-1]["authorization"] == "Bearer token-2"
        token_path(tmp_path).unlink()
        await client.sign(csr(), 600)
        assert "authorization" not in servicer.calls[-1]
    finally:
        await client.close()


async def test_short_chain_is_an_error(scripted: tuple[ScriptedCa, SecurityOptions]) -> None:
    servicer, options = scripted
    servicer.script = ["short"]
    client = CaClient(options, sleep=no_sleep)
    try:
        with pytest.raises(CaError, match="invalid empty CertChain"):
            await client.sign(csr(), 600)
    finally:
        await client.close()
