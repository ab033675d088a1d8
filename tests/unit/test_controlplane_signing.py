"""The CA's decision (authenticate, check the CSR's identity, cap the lifetime), without sockets."""

from __future__ import annotations

import pytest

from istio_agent.pki.certs import (
    build_csr,
    load_pem_chain,
    new_root_ca,
    not_after,
    not_before,
    uri_sans,
    verify_signed_by,
)
from istio_agent.pki.keys import PrivateKey, generate_key
from istiod_local.controlplane.signing import (
    CaRefusal,
    Refusal,
    WorkloadSigner,
    bearer_token,
    effective_ttl,
)
from istiod_local.controlplane.tokens import TokenIdentity, TokenVerifier, issue_token

NOW = 1_800_000_000.0
SLEEP_ID = "spiffe://cluster.local/ns/default/sa/sleep"


class Fixture:
    def __init__(self) -> None:
        self.token_key = generate_key("ECDSA")
        self.ca = new_root_ca(generate_key("ECDSA"), "cluster.local", NOW - 10, 86400 * 365)
        self.signer = WorkloadSigner(self.ca, TokenVerifier(self.token_key.public_key()), "cluster.local", 86400)
        self.workload_key: PrivateKey = generate_key("ECDSA")

    def auth(self, ns: str = "default", sa: str = "sleep", ttl: float = 3600) -> str:
        return "Bearer " + issue_token(self.token_key, TokenIdentity(ns, sa, "sleep-1"), NOW, ttl)

    def csr(self, *sans: str) -> str:
        return build_csr(self.workload_key, list(sans)).decode()


@pytest.fixture(scope="module")
def fx() -> Fixture:
    return Fixture()


def test_signs_matching_csr(fx: Fixture) -> None:
    issued = fx.signer.create_certificate(fx.auth(), fx.csr(SLEEP_ID), 3600, NOW)
    assert len(issued.chain) == 2
    leaf, root = (load_pem_chain(pem)[0] for pem in issued.chain)
    assert root == fx.ca.cert
    assert uri_sans(leaf) == [SLEEP_ID]
    assert verify_signed_by(leaf, root)
    assert not_after(leaf) == NOW + 3600
    assert issued.identity == SLEEP_ID and issued.ttl_seconds == 3600
    assert issued.claims.identity.pod_name == "sleep-1"


def test_rsa_csr_is_signed_too(fx: Fixture) -> None:
    csr = build_csr(generate_key("RSA"), [SLEEP_ID]).decode()
    leaf = load_pem_chain(fx.signer.create_certificate(fx.auth(), csr, 600, NOW).chain[0])[0]
    assert uri_sans(leaf) == [SLEEP_ID]


@pytest.mark.parametrize(
    ("requested", "expected"), [(3600, 3600), (86400, 86400), (86401, 86400), (10**9, 86400), (0, 86400), (-5, 86400)]
)
def test_lifetime_is_capped(fx: Fixture, requested: int, expected: float) -> None:
    assert effective_ttl(requested, 86400) == expected
    leaf = load_pem_chain(fx.signer.create_certificate(fx.auth(), fx.csr(SLEEP_ID), requested, NOW).chain[0])[0]
    assert not_after(leaf) == NOW + expected
    assert not_before(leaf) <= NOW


@pytest.mark.parametrize(
    "sans",
    [
        ["spiffe://cluster.local/ns/default/sa/other"],
        ["spiffe://cluster.local/ns/other/sa/sleep"],
        ["spiffe://evil.example/ns/default/sa/sleep"],
        [SLEEP_ID, "spiffe://cluster.local/ns/default/sa/other"],
        [SLEEP_ID, SLEEP_ID],
        [],
    ],
)
def test_identity_mismatch_is_permission_denied(fx: Fixture, sans: list[str]) -> None:
    with pytest.raises(CaRefusal) as info:
        fx.signer.create_certificate(fx.auth(), fx.csr(*sans), 3600, NOW)
    assert info.value.kind is Refusal.PERMISSION_DENIED
    assert SLEEP_ID in info.value.reason
    assert info.value.caller == SLEEP_ID


def test_extra_dns_san_is_permission_denied(fx: Fixture) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([]))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(SLEEP_ID), x509.DNSName("istiod.example")]),
            critical=False,
        )
        .sign(fx.workload_key, hashes.SHA256())  # type: ignore[arg-type]
        .public_bytes(serialization.Encoding.PEM)
        .decode()
    )
    with pytest.raises(CaRefusal) as info:
        fx.signer.create_certificate(fx.auth(), csr, 3600, NOW)
    assert info.value.kind is Refusal.PERMISSION_DENIED


def test_other_service_accounts_token_is_permission_denied(fx: Fixture) -> None:
    with pytest.raises(CaRefusal) as info:
        fx.signer.create_certificate(fx.auth(sa="other"), fx.csr(SLEEP_ID), 3600, NOW)
    assert info.value.kind is Refusal.PERMISSION_DENIED


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "bearer x.y.z", "Bearer not-a-jwt"],
)
def test_missing_or_bad_token_is_unauthenticated(fx: Fixture, header: str | None) -> None:
    with pytest.raises(CaRefusal) as info:
        fx.signer.create_certificate(header, fx.csr(SLEEP_ID), 3600, NOW)
    assert info.value.kind is Refusal.UNAUTHENTICATED
    assert info.value.reason


def test_expired_token_is_unauthenticated(fx: Fixture) -> None:
    with pytest.raises(CaRefusal) as info:
        fx.signer.create_certificate(fx.auth(ttl=60), fx.csr(SLEEP_ID), 3600, NOW + 61)
    assert info.value.kind is Refusal.UNAUTHENTICATED
    assert "expired" in info.value.reason


def test_malformed_csr_is_invalid_argument(fx: Fixture) -> None:
    for csr in ("", "not a csr", "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"):
        with pytest.raises(CaRefusal) as info:
            fx.signer.create_certificate(fx.auth(), csr, 3600, NOW)
        assert info.value.kind is Refusal.INVALID_ARGUMENT


def test_authentication_comes_before_csr_parsing(fx: Fixture) -> None:
    with pytest.raises(CaRefusal) as info:
        fx.signer.create_certificate(None, "garbage", 3600, NOW)
    assert info.value.kind is Refusal.UNAUTHENTICATED


def test_bearer_token_extraction() -> None:
    assert bearer_token("Bearer abc.def.ghi") == "abc.def.ghi"
    assert bearer_token("Bearer  abc ") == "abc"
