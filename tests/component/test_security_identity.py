"""The identity component against a real `istiod-local`: certificates, rotation, bad tokens, CA outages."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from launchers import IstiodLocal
from security_harness import (
    SdsClient,
    leaf_of,
    pod_options,
    secrets_of,
    sleep_pod,
    token_expiry,
    token_path,
)
from support import eventually

from istio_agent.pki import certs, keys
from istio_agent.security.identity import WorkloadIdentity

SPIFFE = "spiffe://cluster.local/ns/default/sa/sleep"


@pytest.fixture
def pod(tmp_path: Path, istiod: IstiodLocal) -> Path:
    directory = tmp_path / "pod"
    sleep_pod(istiod, directory)
    return directory


def serial_of(path: Path) -> str:
    return certs.serial_hex(leaf_of(path.read_bytes()))


@pytest.mark.parametrize("algorithm", ["ECDSA", "RSA"])
async def test_output_certs_written_verified_and_rotated(algorithm: str, pod: Path, istiod: IstiodLocal) -> None:
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
        root = certs.load_pem_chain(istiod.root_pem())[0]
        assert certs.verify_signed_by(leaf, root)
        assert (out / "root-cert.pem").read_bytes() == istiod.root_pem()
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
        rotated = leaf_of(chain_file.read_bytes())
        # Read from the certificates, not the clock: the new one was issued (notBefore is backdated by
        # BACKDATE) while the first was still valid, i.e. rotated at the grace period, not at expiry.
        issued = certs.not_before(rotated) + certs.BACKDATE.total_seconds()
        assert issued < first_expiry, "rotated only once the first certificate had expired"
        assert certs.public_key_matches(rotated, keys.key_from_pem((out / "key.pem").read_bytes()))
    finally:
        await identity.stop()


def tampered(token: str) -> str:
    head, payload, signature = token.split(".")
    flipped = ("A" if signature[5] != "A" else "B")
    return ".".join([head, payload, signature[:5] + flipped + signature[6:]])


@pytest.mark.parametrize("problem", ["other-service-account", "expired", "tampered"])
async def test_bad_token_never_yields_a_certificate_until_fixed(
    problem: str, tmp_path: Path, istiod: IstiodLocal, caplog: pytest.LogCaptureFixture
) -> None:
    pod = tmp_path / "pod"
    sleep_pod(istiod, pod)
    good = token_path(pod).read_text()
    if problem == "other-service-account":
        bad, expect = istiod.token(service_account="other"), "PERMISSION_DENIED"
    elif problem == "expired":
        bad, expect = istiod.token(service_account="sleep", ttl="1s"), "UNAUTHENTICATED"
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
    pod: Path, istiod: IstiodLocal, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="istio_agent.security")
    # Rotation is due 3 s after issue (1 % of 300 s), while the certificate stays valid for minutes: longer than
    # the whole test, so "still valid" holds at every check below without looking at the clock.
    identity = WorkloadIdentity(pod_options(pod, istiod, secret_ttl=300.0, grace_period_ratio=0.99))
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
        # What the agent holds now (the first certificate, or its rotation if that beat the outage) stays.
        kept = identity.cache.current_workload()
        assert kept is not None, "the cached certificate was dropped while the CA is down"
        kept_serial = certs.serial_hex(leaf_of(kept.cert_chain))
        # A proxy (re)connecting now still gets the cached certificate.
        late = SdsClient(identity.options.sds_socket_path)
        await late.request(["default"])
        current = secrets_of(await late.read())["default"].tls_certificate.certificate_chain.inline_bytes
        assert certs.serial_hex(leaf_of(current)) == kept_serial, "the cached certificate stays in service"

        istiod.start()

        async def pushed_after_the_outage() -> str:
            """The first serial pushed to the early stream that the agent did not hold during the outage."""
            assert watcher is not None
            while True:
                chain = secrets_of(await watcher.read(timeout=30))["default"].tls_certificate.certificate_chain
                serial = certs.serial_hex(leaf_of(chain.inline_bytes))
                if serial not in (first_serial, kept_serial):
                    return serial

        await asyncio.wait_for(pushed_after_the_outage(), 60)  # rotation resumed and was pushed
    finally:
        for client in (watcher, late):
            if client is not None:
                await client.close()
        await identity.stop()
