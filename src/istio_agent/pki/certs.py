"""Certificates: CSRs, issuing (root, serving, workload leaf) and inspection.

Shared by the agent (which makes CSRs and inspects what it gets back) and by
istiod-local (which signs). Everything here is pure: time comes in as `now`.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from istio_agent.pki.keys import PrivateKey, signing_hash

# Issued certificates start this much in the past, so a peer whose clock lags a little still accepts them.
BACKDATE = dt.timedelta(minutes=2)


def utc(now: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(now, tz=dt.UTC)


def build_csr(key: PrivateKey, uri_sans: Sequence[str], organization: str = "") -> bytes:
    """A PEM CSR whose SANs are the given URIs (the workload's SPIFFE id)."""
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization)] if organization else [])
    builder = x509.CertificateSigningRequestBuilder().subject_name(name)
    builder = builder.add_extension(
        x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uri_sans]), critical=False
    )
    csr = builder.sign(key, signing_hash(key))  # type: ignore[arg-type]
    return csr.public_bytes(serialization.Encoding.PEM)


def load_csr(pem: bytes | str) -> x509.CertificateSigningRequest:
    data = pem.encode() if isinstance(pem, str) else pem
    try:
        csr = x509.load_pem_x509_csr(data)
    except ValueError as exc:
        raise ValueError(f"malformed CSR: {exc}") from None
    if not csr.is_signature_valid:
        raise ValueError("CSR signature does not verify")
    return csr


def csr_sans(csr: x509.CertificateSigningRequest) -> list[str]:
    """Every SAN of a CSR as text (URIs, DNS names, IPs, emails), so nothing slips past a check."""
    try:
        ext = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return [str(getattr(name, "value", name)) for name in ext.value]


@dataclass(frozen=True)
class CertificateAuthority:
    """A signing key and its certificate."""

    key: PrivateKey
    cert: x509.Certificate

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


def new_root_ca(key: PrivateKey, organization: str, now: float, ttl_seconds: float) -> CertificateAuthority:
    """A self-signed root, shaped like istiod's self-signed CA (O=<trust domain>, CA:TRUE)."""
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization)])
    start = utc(now) - BACKDATE
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(_serial())
        .not_valid_before(start)
        .not_valid_after(utc(now + ttl_seconds))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, signing_hash(key))  # type: ignore[arg-type]
    )
    return CertificateAuthority(key, cert)


def _serial() -> int:
    return secrets.randbits(127) | 1


def _leaf_builder(
    ca: CertificateAuthority, public_key: object, now: float, ttl_seconds: float, sans: list[x509.GeneralName],
    subject: x509.Name,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(public_key)  # type: ignore[arg-type]
        .serial_number(_serial())
        .not_valid_before(utc(now) - BACKDATE)
        .not_valid_after(utc(now + ttl_seconds))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=True, data_encipherment=False,
                key_agreement=False, key_cert_sign=False, crl_sign=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False)
        # With an empty subject the SAN must be critical (RFC 5280 4.2.1.6).
        .add_extension(x509.SubjectAlternativeName(sans), critical=len(subject) == 0)
    )


def sign_workload_csr(
    ca: CertificateAuthority, csr: x509.CertificateSigningRequest, uri_san: str, now: float, ttl_seconds: float
) -> x509.Certificate:
    """Sign a workload leaf for `uri_san` with the CSR's public key; the subject stays empty as istiod's does."""
    builder = _leaf_builder(ca, csr.public_key(), now, ttl_seconds, [x509.UniformResourceIdentifier(uri_san)],
                            x509.Name([]))
    return builder.sign(ca.key, signing_hash(ca.key))  # type: ignore[arg-type]


def issue_server_cert(
    ca: CertificateAuthority, key: PrivateKey, dns_names: Iterable[str], ips: Iterable[str], now: float,
    ttl_seconds: float,
) -> x509.Certificate:
    """A serving certificate (istiod's own) for DNS names and IP addresses."""
    names = list(dns_names)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]) if names else x509.Name([])
    builder = _leaf_builder(ca, key.public_key(), now, ttl_seconds, sans, subject)
    return builder.sign(ca.key, signing_hash(ca.key))  # type: ignore[arg-type]


def cert_to_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def load_pem_chain(data: bytes | str) -> list[x509.Certificate]:
    """Every certificate in a PEM bundle, in order; ValueError when there is none."""
    raw = data.encode() if isinstance(data, str) else data
    try:
        certs = x509.load_pem_x509_certificates(raw)
    except ValueError as exc:
        raise ValueError(f"malformed PEM certificate bundle: {exc}") from None
    return certs


def uri_sans(cert: x509.Certificate) -> list[str]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return list(ext.value.get_values_for_type(x509.UniformResourceIdentifier))


def not_after(cert: x509.Certificate) -> float:
    return cert.not_valid_after_utc.timestamp()


def not_before(cert: x509.Certificate) -> float:
    return cert.not_valid_before_utc.timestamp()


def serial_hex(cert: x509.Certificate) -> str:
    return format(cert.serial_number, "x")


def verify_signed_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    """True when `issuer`'s key made `cert`'s signature (a single chain link)."""
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, Exception):
        return False
    return True


def public_key_matches(cert: x509.Certificate, key: PrivateKey) -> bool:
    pub = key.public_key()
    want = pub.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    have = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return want == have


__all__ = [
    "CertificateAuthority",
    "build_csr",
    "cert_to_pem",
    "csr_sans",
    "ec",
    "issue_server_cert",
    "load_csr",
    "load_pem_chain",
    "new_root_ca",
    "not_after",
    "not_before",
    "public_key_matches",
    "rsa",
    "serial_hex",
    "sign_workload_csr",
    "uri_sans",
    "verify_signed_by",
]
