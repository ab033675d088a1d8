"""Service-account tokens, as a Kubernetes API server would mint them for a pod.

istiod-local stands in for the cluster: `pod-files` writes a JWT shaped like a
projected service-account token (audience `istio-ca`), and the CA accepts a
CSR only from a caller holding one. Tokens are signed and verified by PyJWT
(ES256 by default, RS256 when the signing key is RSA), with the header a real
cluster writes (`alg` and `kid`, no `typ`), so the wire form is what a real
cluster would produce. What PyJWT cannot know stays here: the Kubernetes
claims, the key id, and the time window, which is checked against the
caller's `now` (PyJWT would read the wall clock) so that it is testable.

Verification is on the CA's hot path, so `TokenVerifier` remembers tokens it
has already verified, keyed by their exact bytes, until they expire: a
workload presents the same token on every rotation, and re-checking an ECDSA
signature each time would cost more than signing its certificate.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.utils import base64url_encode

from istio_agent.pki.keys import PrivateKey

# What a Kubernetes API server puts in `iss` by default; a real cluster's tokens look like this.
DEFAULT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# The audience Istio's injector asks for on the projected `istio-token` volume.
ISTIO_CA_AUDIENCE = "istio-ca"
SUBJECT_PREFIX = "system:serviceaccount:"
# Claims every projected service-account token carries; a token without one of them is refused.
REQUIRED_CLAIMS = ("iss", "aud", "sub", "exp")

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey

# PyJWT checks structure, algorithm, signature, issuer, audience and the presence of
# REQUIRED_CLAIMS; it must not check exp/nbf/iat against its own clock (see check_time_window).
_JWT = jwt.PyJWT(
    options={"verify_exp": False, "verify_nbf": False, "verify_iat": False, "require": list(REQUIRED_CLAIMS)}
)


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
    """The `kid` header: a digest of the public key, so a token from another key is refused as such."""
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64url_encode(hashlib.sha256(der).digest()[:16]).decode("ascii")


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
    # `typ: None` drops PyJWT's default "typ": "JWT": Kubernetes' tokens carry only alg and kid.
    return _JWT.encode(payload, key, algorithm=alg, headers={"kid": key_id(key.public_key()), "typ": None})


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


@dataclass(frozen=True)
class _VerificationKey:
    """A public key with what verification derives from it (algorithm, `kid`), worked out once."""

    public_key: PublicKey
    algorithm: str
    kid: str

    @classmethod
    def of(cls, public_key: PublicKey) -> _VerificationKey:
        return cls(public_key, _algorithm(public_key), key_id(public_key))


def _header_field(token: str, name: str) -> object:
    """A header field of a token PyJWT has already refused, to say why (the header parsed then)."""
    try:
        return jwt.get_unverified_header(token).get(name)
    except jwt.PyJWTError:
        return None


def _refusal(err: jwt.PyJWTError, token: str, audience: str, issuer: str) -> TokenError:
    """Why PyJWT refused a token, told with the offending claim's value where there is one."""
    if isinstance(err, jwt.MissingRequiredClaimError):
        return TokenError(f"token has no {err.claim!r} claim")
    if not isinstance(err, jwt.InvalidIssuerError | jwt.InvalidAudienceError):
        return TokenError(f"token refused: {err}")
    # PyJWT checks iss and aud only once the signature has verified, so this payload is genuine.
    payload = jwt.decode(token, options={"verify_signature": False})
    if isinstance(err, jwt.InvalidIssuerError):
        return TokenError(f"token issuer {payload.get('iss')!r} is not {issuer!r}")
    aud = payload.get("aud")
    audiences = _audiences(aud)
    if audiences is None:
        return TokenError(f"token audience {aud!r} is not a string or a list of strings")
    return TokenError(f"token audience {list(audiences)} does not include {audience!r}")


def _verify(
    token: str, key: _VerificationKey, now: float, audience: str = ISTIO_CA_AUDIENCE, issuer: str = DEFAULT_ISSUER
) -> TokenClaims:
    """decode_and_verify with the key's algorithm and id already worked out (TokenVerifier keeps them).

    One PyJWT pass checks the structure, the algorithm (only the key's own: no `none`, no HS256 keyed
    with the public key), the signature, the issuer, the audience and that REQUIRED_CLAIMS are there;
    the key id, the Kubernetes claims and the time window are checked here.
    """
    if token.count(".") != 2:
        raise TokenError("token is not a JWT (expected three dot-separated parts)")
    try:
        decoded = _JWT.decode_complete(token, key.public_key, algorithms=[key.algorithm], audience=audience,
                                       issuer=issuer)
    except jwt.InvalidAlgorithmError:
        alg = _header_field(token, "alg")
        raise TokenError(f"token algorithm {alg!r} is not accepted (expected {key.algorithm})") from None
    except jwt.InvalidSignatureError:
        if _header_field(token, "kid") not in (None, key.kid):
            raise TokenError("token was signed by an unknown key") from None
        raise TokenError("token signature does not verify") from None
    except jwt.DecodeError as err:
        raise TokenError(f"token is not a well-formed JWT: {err}") from None
    except jwt.PyJWTError as err:
        raise _refusal(err, token, audience, issuer) from None
    if decoded["header"].get("kid", key.kid) != key.kid:
        raise TokenError("token was signed by an unknown key")
    payload = decoded["payload"]
    expires = _number(payload, "exp")
    not_before = _number(payload, "nbf") if "nbf" in payload else 0.0
    issued = _number(payload, "iat") if "iat" in payload else 0.0
    audiences = _audiences(payload["aud"]) or ()
    claims = TokenClaims(_identity_from(payload), issuer, audiences, issued, not_before, expires)
    check_time_window(claims, now)
    return claims


def decode_and_verify(
    token: str, public_key: PublicKey, now: float, audience: str = ISTIO_CA_AUDIENCE, issuer: str = DEFAULT_ISSUER
) -> TokenClaims:
    """Check a token completely (structure, algorithm, key id, signature, issuer, audience, time window)."""
    return _verify(token, _VerificationKey.of(public_key), now, audience, issuer)


def _audiences(aud: object) -> tuple[str, ...] | None:
    """`aud` may be one string or a list of them (RFC 7519 4.1.3); None when it is neither."""
    if isinstance(aud, str):
        return (aud,)
    if isinstance(aud, list) and all(isinstance(a, str) for a in aud):
        return tuple(aud)
    return None


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
    _key: _VerificationKey = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._key = _VerificationKey.of(self.public_key)

    def verify(self, token: str, now: float) -> TokenClaims:
        claims = self._cache.get(token)
        if claims is not None:
            if now >= claims.expires_at:
                del self._cache[token]
            check_time_window(claims, now)
            return claims
        claims = _verify(token, self._key, now, self.audience, self.issuer)
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
