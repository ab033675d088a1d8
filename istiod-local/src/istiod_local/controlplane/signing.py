"""The CA's decision, without gRPC: who is asking, for what identity, and for how long.

`WorkloadSigner.create_certificate` takes the raw `authorization` header,
the CSR and the requested lifetime, and returns the chain or raises a
`CaRefusal` that carries the gRPC status to answer with. Keeping this pure
(time comes in as `now`) lets the unit tests cover every refusal without a
socket, and leaves the servicer a thin translation layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from cryptography import x509

from istio_agent.pki.certs import CertificateAuthority, cert_to_pem, csr_sans, load_csr, sign_workload_csr
from istio_agent.pki.spiffe import SpiffeId
from istiod_local.controlplane.tokens import TokenClaims, TokenError, TokenVerifier

BEARER_PREFIX = "Bearer "


class Refusal(Enum):
    """Why a request is refused, named after the gRPC status it maps to."""

    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"


class CaRefusal(Exception):
    """A refused request: `kind` picks the status code, `reason` is what the caller (and the log) is told."""

    def __init__(self, kind: Refusal, reason: str, caller: str = "") -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        self.caller = caller


@dataclass(frozen=True)
class Issued:
    """A signed certificate and what the log line about it needs."""

    chain: list[str]
    identity: str
    serial: int
    ttl_seconds: float
    claims: TokenClaims


def bearer_token(authorization: str | None) -> str:
    """The token from an `authorization: Bearer <jwt>` header; UNAUTHENTICATED when there is none."""
    if authorization is None:
        raise CaRefusal(Refusal.UNAUTHENTICATED, "no authorization header (expected 'Bearer <token>')")
    if not authorization.startswith(BEARER_PREFIX) or not authorization[len(BEARER_PREFIX):].strip():
        raise CaRefusal(Refusal.UNAUTHENTICATED, "authorization header carries no bearer token")
    return authorization[len(BEARER_PREFIX):].strip()


def effective_ttl(requested_seconds: int, max_seconds: float) -> float:
    """The requested lifetime capped by the maximum; zero or negative asks for the maximum."""
    if requested_seconds <= 0:
        return max_seconds
    return float(min(requested_seconds, max_seconds))


def check_csr_identity(csr: x509.CertificateSigningRequest, expected: str) -> None:
    """The CSR must name exactly one SAN, the caller's SPIFFE id; anything else is PERMISSION_DENIED."""
    sans = csr_sans(csr)
    if sans != [expected]:
        raise CaRefusal(
            Refusal.PERMISSION_DENIED,
            f"CSR asks for SANs {sans} but the caller may only have exactly [{expected!r}]",
        )


@dataclass
class WorkloadSigner:
    """Signs workload CSRs for callers holding a valid service-account token."""

    ca: CertificateAuthority
    verifier: TokenVerifier
    trust_domain: str
    max_ttl_seconds: float

    def __post_init__(self) -> None:
        self._root_pem = cert_to_pem(self.ca.cert)

    def authenticate(self, authorization: str | None, now: float) -> TokenClaims:
        token = bearer_token(authorization)
        try:
            return self.verifier.verify(token, now)
        except TokenError as exc:
            raise CaRefusal(Refusal.UNAUTHENTICATED, f"invalid bearer token: {exc}") from None

    def create_certificate(
        self, authorization: str | None, csr_pem: str, requested_ttl: int, now: float
    ) -> Issued:
        claims = self.authenticate(authorization, now)
        ident = claims.identity
        expected = str(SpiffeId(self.trust_domain, ident.namespace, ident.service_account))
        try:
            csr = load_csr(csr_pem)
        except ValueError as exc:
            raise CaRefusal(Refusal.INVALID_ARGUMENT, str(exc), caller=expected) from None
        try:
            check_csr_identity(csr, expected)
        except CaRefusal as refusal:
            refusal.caller = expected
            raise
        ttl = effective_ttl(requested_ttl, self.max_ttl_seconds)
        cert = sign_workload_csr(self.ca, csr, expected, now, ttl)
        return Issued([cert_to_pem(cert), self._root_pem], expected, cert.serial_number, ttl, claims)
