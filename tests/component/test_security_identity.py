"""The identity component against a real `istiod-local`: certificates, rotation, bad tokens, CA outages."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from security_harness import (
    Istiod,
    SdsClient,
    leaf_of,
    pod_options,
    secrets_of,
    token_expiry,
    token_path,
)
from support import eventually

from istio_agent.pki import certs, keys
from istio_agent.security.identity import WorkloadIdentity

SPIFFE = "spiffe://cluster.local/ns/default/sa/sleep"


@pytest.fixture
def istiod(tmp_path: Path) -> Iterator[Istiod]:
    server = Istiod(tmp_path / "istiod-state")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def pod(tmp_path: Path, istiod: Istiod) -> Path:
    directory = tmp_path / "pod"
    istiod.pod_files(directory)
    return directory


def serial_of(path: Path) -> str:
    return certs.serial_hex(leaf_of(path.read_bytes()))


@pytest.mark.parametrize("algorithm", ["ECDSA", "RSA"])
async def test_output_certs_written_verified_and_rotated(algorithm: str, pod: Path, istiod: Istiod) -> None:
    out = pod / "out"
    identity = WorkloadIdentity(
        pod_options(pod, istiod, key_algorithm=algorithm, output_certs=str(out), run_sds_server=False)
    )
    await identity.start()
    try:
        chain_file = out / "cert-chain.pem"
        await eventually(chain_file.exists, what="cert-chain.pem written")
        leaf = leaf_of(chain_file.read_bytes())
        first_expiry = certs.not_after(leaf)
        sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert [str(name.value) for name in sans] == [SPIFFE], "exactly one SAN: the SPIFFE id"
        root = certs.load_pem_chain(istiod.root_pem(pod))[0]
        assert certs.verify_signed_by(leaf, root)
        assert (out / "root-cert.pem").read_bytes() == istiod.root_pem(pod)
        key = keys.key_from_pem((out / "key.pem").read_bytes())
        assert certs.public_key_matches(leaf, key)
        assert isinstance(key, ec.EllipticCurvePrivateKey if algorithm == "ECDSA" else rsa.RSAPrivateKey)
        if isinstance(key, rsa.RSAPrivateKey):
            assert key.key_size == 2048
        for name in ("key.pem", "cert-chain.pem", "root-cert.pem"):
            assert (out / name).stat().st_mode & 0o777 == 0o600
        assert not identity.options.sds_socket_path.exists(), "DISABLE_ENVOY: no SDS server"

        first = certs.serial_hex(leaf)
        await eventually(lambda: serial_of(chain_file) != first, what="rotated certificate written")
        assert time.time() < first_expiry, "rotated well before the first certificate expired"
        rotated = leaf_of(chain_file.read_bytes())
        assert certs.public_key_matches(rotated, keys.key_from_pem((out / "key.pem").read_bytes()))
    finally:
        await identity.stop()


def tampered(token: str) -> str:
    head, payload, signature = token.split(".")
    flipped = ("A" if signature[5] != "A" else "B")
    return ".".join([head, payload, signature[:5] + flipped + signature[6:]])


@pytest.mark.parametrize("problem", ["other-service-account", "expired", "tampered"])
async def test_bad_token_never_yields_a_certificate_until_fixed(
    problem: str, tmp_path: Path, istiod: Istiod, caplog: pytest.LogCaptureFixture
) -> None:
    pod = tmp_path / "pod"
    istiod.pod_files(pod)
    good = token_path(pod).read_text()
    if problem == "other-service-account":
        bad, expect = istiod.token(service_account="other"), "PERMISSION_DENIED"
    elif problem == "expired":
        bad, expect = istiod.token(ttl="1s"), "UNAUTHENTICATED"
        expiry = token_expiry(bad)
        await eventually(lambda: time.time() > expiry + 0.5, what="token expired")
    else:
        bad, expect = tampered(good), "UNAUTHENTICATED"
    token_path(pod).write_text(bad)

    caplog.set_level(logging.WARNING, logger="istio_agent.security")
    out = pod / "out"
    identity = WorkloadIdentity(pod_options(pod, istiod, output_certs=str(out), run_sds_server=False))
    await identity.start()
    try:
        def refusals() -> int:
            return sum(1 for r in caplog.records if "cannot get a workload certificate" in r.getMessage()
                       and expect in r.getMessage())

        await eventually(lambda: refusals() >= 3, what=f"agent logs {expect} and keeps retrying")
        assert identity.cache.current_workload() is None
        assert not (out / "cert-chain.pem").exists()

        token_path(pod).write_text(good)
        await eventually(lambda: (out / "cert-chain.pem").exists(), what="certificate after the token was fixed")
        assert certs.uri_sans(leaf_of((out / "cert-chain.pem").read_bytes())) == [SPIFFE]
    finally:
        await identity.stop()


async def test_ca_outage_keeps_the_certificate_and_rotation_resumes(
    pod: Path, istiod: Istiod, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="istio_agent.security")
    identity = WorkloadIdentity(pod_options(pod, istiod, secret_ttl=10.0, grace_period_ratio=0.8))
    await identity.start()
    watcher = late = None
    try:
        first = await identity.wait_for_certificate(timeout=20)
        first_serial = certs.serial_hex(leaf_of(first.cert_chain))
        watcher = SdsClient(identity.options.sds_socket_path)
        await watcher.request(["default"])
        served = secrets_of(await watcher.read())["default"]
        assert certs.serial_hex(leaf_of(served.tls_certificate.certificate_chain.inline_bytes)) == first_serial

        istiod.stop()
        await eventually(
            lambda: any("keeping the current certificate" in r.getMessage() for r in caplog.records),
            what="rotation attempt fails while the CA is down",
        )
        # A proxy (re)connecting now still gets the cached certificate while it is valid.
        late = SdsClient(identity.options.sds_socket_path)
        await late.request(["default"])
        response = await late.read()
        if time.time() < first.expires - 0.5:
            current = secrets_of(response)["default"].tls_certificate.certificate_chain.inline_bytes
            assert certs.serial_hex(leaf_of(current)) == first_serial

        istiod.start()
        pushed = await watcher.read(timeout=30)
        new_chain = secrets_of(pushed)["default"].tls_certificate.certificate_chain.inline_bytes
        assert certs.serial_hex(leaf_of(new_chain)) != first_serial, "rotation resumed and was pushed"
    finally:
        for client in (watcher, late):
            if client is not None:
                await client.close()
        await identity.stop()
