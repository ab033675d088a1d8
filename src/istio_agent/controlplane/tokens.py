"""Service-account tokens, as a Kubernetes API server would mint them for a pod.

istiod-local stands in for the cluster: `pod-files` writes a JWT shaped like a
projected service-account token (audience `istio-ca`), and the CA accepts a
CSR only from a caller holding one. The JWT is written by hand on top of
`cryptography` (ES256 by default, RS256 when the signing key is RSA) so that
the wire form is exactly what a real cluster would produce, with no extra
dependency.

Verification is on the CA's hot path, so `TokenVerifier` remembers tokens it
has already verified, keyed by their exact bytes, until they expire: a
workload presents the same token on every rotation, and re-checking an ECDSA
signature each time would cost more than signing its certificate.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature

from istio_agent.pki.keys import PrivateKey

# What a Kubernetes API server puts in `iss` by default; a real cluster's tokens look like this.
DEFAULT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# The audience Istio's injector asks for on the projected `istio-token` volume.
ISTIO_CA_AUDIENCE = "istio-ca"
SUBJECT_PREFIX = "system:serviceaccount:"

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey


class TokenError(ValueError):
    """A token was refused; the message says why (it ends up in the UNAUTHENTICATED status)."""


@dataclass(frozen=True)
class TokenIdentity:
    """Who a token speaks for: the pod's service account (and, for a pod-bound token, the pod)."""

    namespace: str
    service_account: str
    pod_name: str = ""
    pod_uid: str = ""
    service_account_uid: str = ""

    @property
    def subject(self) -> str:
        return f"{SUBJECT_PREFIX}{self.namespace}:{self.service_account}"


@dataclass(frozen=True)
class TokenClaims:
    """The verified content of a token."""

    identity: TokenIdentity
    issuer: str
    audiences: tuple[str, ...]
    issued_at: float
    not_before: float
    expires_at: float


def stable_uid(*parts: str) -> str:
    """A UID that stays the same for the same object, so re-minted tokens describe the same pod/account."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "istiod-local:" + "/".join(parts)))


def key_id(public_key: PublicKey) -> str:
    """The `kid` header: a digest of the public key, so a token from another key is refused before any math."""
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return _b64encode(hashlib.sha256(der).digest()[:16])


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    if not text or any(c in text for c in "=+/ \n"):
        raise TokenError("token is not base64url-encoded")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise TokenError("token is not base64url-encoded") from None


def _algorithm(key: PrivateKey | PublicKey) -> str:
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey):
        if key.curve.name != "secp256r1":
            raise ValueError(f"token keys on curve {key.curve.name} are not supported; use P-256 (ES256)")
        return "ES256"
    return "RS256"


def issue_token(
    key: PrivateKey,
    identity: TokenIdentity,
    now: float,
    ttl_seconds: float,
    audiences: Sequence[str] = (ISTIO_CA_AUDIENCE,),
    issuer: str = DEFAULT_ISSUER,
) -> str:
    """A signed JWT with the claims of a Kubernetes projected service-account token."""
    alg = _algorithm(key)
    header = {"alg": alg, "kid": key_id(key.public_key())}
    kube: dict[str, Any] = {
        "namespace": identity.namespace,
        "serviceaccount": {
            "name": identity.service_account,
            "uid": identity.service_account_uid or stable_uid(identity.namespace, "sa", identity.service_account),
        },
    }
    if identity.pod_name:
        kube["pod"] = {"name": identity.pod_name, "uid": identity.pod_uid or stable_uid(identity.namespace, "pod",
                                                                                          identity.pod_name)}
    issued = int(now)
    payload = {
        "aud": list(audiences),
        "exp": int(now + ttl_seconds),
        "iat": issued,
        "iss": issuer,
        "kubernetes.io": kube,
        "nbf": issued,
        "sub": identity.subject,
    }
    signing_input = (
        _b64encode(json.dumps(header, separators=(",", ":")).encode())
        + "."
        + _b64encode(json.dumps(payload, separators=(",", ":")).encode())
    ).encode("ascii")
    if isinstance(key, ec.EllipticCurvePrivateKey):
        r, s = decode_dss_signature(key.sign(signing_input, ec.ECDSA(hashes.SHA256())))
        signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    else:
        signature = key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
    return signing_input.decode("ascii") + "." + _b64encode(signature)


def _verify_signature(public_key: PublicKey, signing_input: bytes, signature: bytes) -> None:
    try:
        if isinstance(public_key, ec.EllipticCurvePublicKey):
            if len(signature) != 64:
                raise TokenError("token signature has the wrong length for ES256")
            der = encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big"))
            public_key.verify(der, signing_input, ec.ECDSA(hashes.SHA256()))
        else:
            public_key.verify(signature, signing_input, padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        raise TokenError("token signature does not verify") from None


def _json_object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise TokenError(f"token {what} is not JSON") from None
    if not isinstance(value, dict):
        raise TokenError(f"token {what} is not a JSON object")
    return value


def _number(payload: dict[str, Any], name: str) -> float:
    value = payload.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TokenError(f"token has no numeric {name!r} claim")
    return float(value)


def _identity_from(payload: dict[str, Any]) -> TokenIdentity:
    """Who the token is for: from `sub` (as a TokenReview reports it), cross-checked with `kubernetes.io`."""
    sub = payload.get("sub")
    if not isinstance(sub, str) or not sub.startswith(SUBJECT_PREFIX):
        raise TokenError(f"token subject {sub!r} is not a service account (system:serviceaccount:<ns>:<sa>)")
    parts = sub[len(SUBJECT_PREFIX):].split(":")
    if len(parts) != 2 or not all(parts):
        raise TokenError(f"token subject {sub!r} is not a service account (system:serviceaccount:<ns>:<sa>)")
    namespace, account = parts
    kube = payload.get("kubernetes.io")
    pod_name = pod_uid = sa_uid = ""
    if kube is not None:
        if not isinstance(kube, dict):
            raise TokenError("token 'kubernetes.io' claim is not an object")
        sa = kube.get("serviceaccount") or {}
        pod = kube.get("pod") or {}
        if not isinstance(sa, dict) or not isinstance(pod, dict):
            raise TokenError("token 'kubernetes.io' claim is malformed")
        if kube.get("namespace") != namespace or sa.get("name", account) != account:
            raise TokenError(f"token 'kubernetes.io' claim disagrees with subject {sub!r}")
        pod_name, pod_uid = str(pod.get("name", "")), str(pod.get("uid", ""))
        sa_uid = str(sa.get("uid", ""))
    return TokenIdentity(namespace, account, pod_name, pod_uid, sa_uid)


def decode_and_verify(
    token: str, public_key: PublicKey, now: float, audience: str = ISTIO_CA_AUDIENCE, issuer: str = DEFAULT_ISSUER
) -> TokenClaims:
    """Check a token completely (structure, algorithm, key id, signature, issuer, audience, time window)."""
    parts = token.split(".")
    if len(parts) != 3:
        raise TokenError("token is not a JWT (expected three dot-separated parts)")
    header = _json_object(_b64decode(parts[0]), "header")
    want_alg = _algorithm(public_key)
    if header.get("alg") != want_alg:
        raise TokenError(f"token algorithm {header.get('alg')!r} is not accepted (expected {want_alg})")
    if "kid" in header and header["kid"] != key_id(public_key):
        raise TokenError("token was signed by an unknown key")
    _verify_signature(public_key, (parts[0] + "." + parts[1]).encode("ascii"), _b64decode(parts[2]))
    payload = _json_object(_b64decode(parts[1]), "payload")
    if payload.get("iss") != issuer:
        raise TokenError(f"token issuer {payload.get('iss')!r} is not {issuer!r}")
    audiences = _audiences(payload.get("aud"))
    if audience not in audiences:
        raise TokenError(f"token audience {list(audiences)} does not include {audience!r}")
    expires = _number(payload, "exp")
    not_before = _number(payload, "nbf") if "nbf" in payload else 0.0
    issued = _number(payload, "iat") if "iat" in payload else 0.0
    claims = TokenClaims(_identity_from(payload), issuer, audiences, issued, not_before, expires)
    check_time_window(claims, now)
    return claims


def _audiences(aud: object) -> tuple[str, ...]:
    """`aud` may be one string or a list of them (RFC 7519 4.1.3)."""
    if isinstance(aud, str):
        return (aud,)
    if isinstance(aud, list):
        return tuple(a for a in aud if isinstance(a, str))
    return ()


def check_time_window(claims: TokenClaims, now: float) -> None:
    if now >= claims.expires_at:
        raise TokenError(f"token expired {int(now - claims.expires_at)}s ago")
    if now < claims.not_before:
        raise TokenError(f"token is not valid for another {int(claims.not_before - now)}s (nbf)")


@dataclass
class TokenVerifier:
    """Verifies bearer tokens for the CA, remembering good ones (by exact text) until they expire.

    Only successfully verified tokens are remembered, and the time window is
    re-checked on every hit, so the cache can never accept what a full check
    would refuse. The cache is bounded: when full, expired entries go first,
    then everything.
    """

    public_key: PublicKey
    audience: str = ISTIO_CA_AUDIENCE
    issuer: str = DEFAULT_ISSUER
    max_cached: int = 10_000
    _cache: dict[str, TokenClaims] = field(default_factory=dict, repr=False)

    def verify(self, token: str, now: float) -> TokenClaims:
        claims = self._cache.get(token)
        if claims is not None:
            if now >= claims.expires_at:
                del self._cache[token]
            check_time_window(claims, now)
            return claims
        claims = decode_and_verify(token, self.public_key, now, self.audience, self.issuer)
        if len(self._cache) >= self.max_cached:
            self._evict(now)
        self._cache[token] = claims
        return claims

    def _evict(self, now: float) -> None:
        for cached, cached_claims in list(self._cache.items()):
            if now >= cached_claims.expires_at:
                del self._cache[cached]
        if len(self._cache) >= self.max_cached:
            self._cache.clear()

    @property
    def cached(self) -> int:
        return len(self._cache)
