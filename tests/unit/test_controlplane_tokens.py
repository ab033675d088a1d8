"""Service-account JWTs: what istiod-local mints, and every way a token must be refused."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import jwt
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.utils import der_to_raw_signature

from istio_agent.pki.keys import generate_key
from istiod_local.controlplane.tokens import (
    DEFAULT_ISSUER,
    TokenError,
    TokenIdentity,
    TokenVerifier,
    decode_and_verify,
    issue_token,
    key_id,
)

NOW = 1_800_000_000.0
SLEEP = TokenIdentity("default", "sleep", "sleep-1")


@pytest.fixture(scope="module")
def key():  # type: ignore[no-untyped-def]
    return generate_key("ECDSA")


def _part(token: str, index: int) -> dict[str, object]:
    raw = token.split(".")[index]
    return json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))


def _reencode(obj: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


def _sign(key, payload: dict[str, object], header: dict[str, object]) -> str:  # type: ignore[no-untyped-def]
    """A token signed by `key` (so its signature verifies) with whatever claims a test needs."""
    return jwt.encode(payload, key, algorithm=str(header["alg"]), headers={**header, "typ": None})


def test_valid_token_has_kubernetes_claims(key) -> None:  # type: ignore[no-untyped-def]
    token = issue_token(key, SLEEP, NOW, 3600)
    payload = _part(token, 1)
    assert payload["sub"] == "system:serviceaccount:default:sleep"
    assert payload["aud"] == ["istio-ca"]
    assert payload["iss"] == DEFAULT_ISSUER
    assert payload["iat"] == payload["nbf"] == int(NOW)
    assert payload["exp"] == int(NOW) + 3600
    kube = payload["kubernetes.io"]
    assert isinstance(kube, dict)
    assert kube["namespace"] == "default"
    assert kube["serviceaccount"]["name"] == "sleep" and kube["serviceaccount"]["uid"]
    assert kube["pod"]["name"] == "sleep-1" and kube["pod"]["uid"]
    assert _part(token, 0) == {"alg": "ES256", "kid": key_id(key.public_key())}  # as a cluster writes it: no typ

    claims = decode_and_verify(token, key.public_key(), NOW + 10)
    assert claims.identity.namespace == "default"
    assert claims.identity.service_account == "sleep"
    assert claims.identity.pod_name == "sleep-1"
    assert claims.expires_at == int(NOW) + 3600


def test_token_without_pod_has_no_pod_claim(key) -> None:  # type: ignore[no-untyped-def]
    token = issue_token(key, TokenIdentity("ns1", "sa1"), NOW, 60)
    assert "pod" not in _part(token, 1)["kubernetes.io"]  # type: ignore[operator]
    assert decode_and_verify(token, key.public_key(), NOW).identity.pod_name == ""


def test_rs256_tokens_round_trip() -> None:
    rsa_key = generate_key("RSA")
    token = issue_token(rsa_key, SLEEP, NOW, 60)
    assert _part(token, 0)["alg"] == "RS256"
    assert decode_and_verify(token, rsa_key.public_key(), NOW).identity.service_account == "sleep"
    with pytest.raises(TokenError, match="algorithm"):
        decode_and_verify(token, generate_key("ECDSA").public_key(), NOW)


@pytest.mark.parametrize("offset", [3600, 3600 + 1, 10_000])
def test_expired_token_is_refused(key, offset: float) -> None:  # type: ignore[no-untyped-def]
    token = issue_token(key, SLEEP, NOW, 3600)
    with pytest.raises(TokenError, match="expired"):
        decode_and_verify(token, key.public_key(), NOW + offset)


def test_not_yet_valid_token_is_refused(key) -> None:  # type: ignore[no-untyped-def]
    token = issue_token(key, SLEEP, NOW, 3600)
    with pytest.raises(TokenError, match="nbf"):
        decode_and_verify(token, key.public_key(), NOW - 30)


def test_tampered_payload_is_refused(key) -> None:  # type: ignore[no-untyped-def]
    token = issue_token(key, SLEEP, NOW, 3600)
    header, _, signature = token.split(".")
    payload = _part(token, 1)
    payload["sub"] = "system:serviceaccount:istio-system:istiod"
    forged = f"{header}.{_reencode(payload)}.{signature}"
    with pytest.raises(TokenError, match="signature"):
        decode_and_verify(forged, key.public_key(), NOW)


def test_tampered_signature_is_refused(key) -> None:  # type: ignore[no-untyped-def]
    token = issue_token(key, SLEEP, NOW, 3600)
    head, _, sig = token.rpartition(".")
    raw = bytearray(base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4)))
    raw[10] ^= 0x01
    forged = head + "." + base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
    with pytest.raises(TokenError, match="signature"):
        decode_and_verify(forged, key.public_key(), NOW)


def test_wrong_audience_is_refused(key) -> None:  # type: ignore[no-untyped-def]
    token = issue_token(key, SLEEP, NOW, 3600, audiences=("https://kubernetes.default.svc",))
    with pytest.raises(TokenError, match="audience"):
        decode_and_verify(token, key.public_key(), NOW)


def test_audience_list_containing_istio_ca_is_accepted(key) -> None:  # type: ignore[no-untyped-def]
    token = issue_token(key, SLEEP, NOW, 3600, audiences=("other", "istio-ca"))
    assert decode_and_verify(token, key.public_key(), NOW).audiences == ("other", "istio-ca")


def test_wrong_issuer_is_refused(key) -> None:  # type: ignore[no-untyped-def]
    token = issue_token(key, SLEEP, NOW, 3600, issuer="https://evil.example")
    with pytest.raises(TokenError, match="issuer"):
        decode_and_verify(token, key.public_key(), NOW)


def test_token_from_another_key_is_refused(key) -> None:  # type: ignore[no-untyped-def]
    other = generate_key("ECDSA")
    token = issue_token(other, SLEEP, NOW, 3600)
    with pytest.raises(TokenError, match="unknown key"):
        decode_and_verify(token, key.public_key(), NOW)
    # Without the kid hint the signature check alone still refuses it.
    header = _part(token, 0)
    del header["kid"]
    _, payload, sig = token.split(".")
    with pytest.raises(TokenError, match="signature"):
        decode_and_verify(f"{_reencode(header)}.{payload}.{sig}", key.public_key(), NOW)


def test_alg_none_and_hs256_are_refused(key) -> None:  # type: ignore[no-untyped-def]
    token = issue_token(key, SLEEP, NOW, 3600)
    _, payload, _ = token.split(".")
    for alg in ("none", "HS256", "RS256"):
        header = _reencode({"alg": alg})
        with pytest.raises(TokenError, match="algorithm"):
            decode_and_verify(f"{header}.{payload}.", key.public_key(), NOW)


@pytest.mark.parametrize("garbage", ["", "abc", "a.b", "a.b.c.d", "!!!.???.***", "e30.e30.e30"])
def test_garbage_is_refused_with_a_reason(key, garbage: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TokenError) as info:
        decode_and_verify(garbage, key.public_key(), NOW)
    assert str(info.value)


def test_subject_and_kubernetes_claim_must_agree(key) -> None:  # type: ignore[no-untyped-def]
    # Signed by the right key, but sub and kubernetes.io disagree: refuse rather than guess.
    token = issue_token(key, SLEEP, NOW, 3600)
    payload = _part(token, 1)
    payload["sub"] = "system:serviceaccount:default:other"
    with pytest.raises(TokenError, match="disagrees"):
        decode_and_verify(_sign(key, payload, _part(token, 0)), key.public_key(), NOW)


def test_verifier_caches_good_tokens_until_expiry(key) -> None:  # type: ignore[no-untyped-def]
    verifier = TokenVerifier(key.public_key())
    token = issue_token(key, SLEEP, NOW, 100)
    first = verifier.verify(token, NOW)
    assert verifier.cached == 1
    assert verifier.verify(token, NOW + 50) is first  # served from the cache
    with pytest.raises(TokenError, match="expired"):
        verifier.verify(token, NOW + 100)
    assert verifier.cached == 0


def test_verifier_does_not_cache_refusals(key) -> None:  # type: ignore[no-untyped-def]
    verifier = TokenVerifier(key.public_key())
    token = issue_token(generate_key("ECDSA"), SLEEP, NOW, 100)
    for _ in range(2):
        with pytest.raises(TokenError):
            verifier.verify(token, NOW)
    assert verifier.cached == 0


def test_verifier_cache_is_bounded(key) -> None:  # type: ignore[no-untyped-def]
    verifier = TokenVerifier(key.public_key(), max_cached=3)
    for i in range(10):
        verifier.verify(issue_token(key, TokenIdentity("ns", f"sa{i}"), NOW, 100), NOW)
        assert verifier.cached <= 3


@pytest.mark.parametrize("claim", ["iss", "aud", "sub", "exp"])
def test_token_missing_a_required_claim_is_refused(key, claim: str) -> None:  # type: ignore[no-untyped-def]
    token = issue_token(key, SLEEP, NOW, 3600)
    payload = _part(token, 1)
    del payload[claim]
    with pytest.raises(TokenError, match=f"token has no '{claim}' claim"):
        decode_and_verify(_sign(key, payload, _part(token, 0)), key.public_key(), NOW)


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"exp": "tomorrow"}, "no numeric 'exp' claim"),
        ({"nbf": True}, "no numeric 'nbf' claim"),
        ({"aud": {"istio-ca": True}}, "audience .* is not a string or a list of strings"),
        ({"aud": ["istio-ca", 7]}, "audience .* is not a string or a list of strings"),
        ({"sub": "alice"}, "subject 'alice' is not a service account"),
        ({"sub": "system:serviceaccount:default"}, "is not a service account"),
        ({"kubernetes.io": "default"}, "'kubernetes.io' claim is not an object"),
        ({"kubernetes.io": {"namespace": "default", "pod": "p"}}, "'kubernetes.io' claim is malformed"),
    ],
)
def test_malformed_claims_are_refused(key, claims: dict[str, object], reason: str) -> None:  # type: ignore[no-untyped-def]
    token = issue_token(key, SLEEP, NOW, 3600)
    payload = {**_part(token, 1), **claims}
    with pytest.raises(TokenError, match=reason):
        decode_and_verify(_sign(key, payload, _part(token, 0)), key.public_key(), NOW)


def test_single_string_audience_is_accepted(key) -> None:  # type: ignore[no-untyped-def]
    token = issue_token(key, SLEEP, NOW, 3600)
    payload = {**_part(token, 1), "aud": "istio-ca"}
    claims = decode_and_verify(_sign(key, payload, _part(token, 0)), key.public_key(), NOW)
    assert claims.audiences == ("istio-ca",)


def test_hs256_signed_with_the_public_key_is_refused(key) -> None:  # type: ignore[no-untyped-def]
    # The classic confusion: an HMAC keyed with the verifier's public key must not pass as a signature.
    pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    signing_input = _reencode({"alg": "HS256", "kid": key_id(key.public_key())}) + "." + _reencode(
        _part(issue_token(key, SLEEP, NOW, 3600), 1))
    mac = hmac.new(pem, signing_input.encode(), hashlib.sha256).digest()
    forged = signing_input + "." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()
    with pytest.raises(TokenError, match="algorithm 'HS256' is not accepted"):
        decode_and_verify(forged, key.public_key(), NOW)


def test_signature_of_the_wrong_length_is_refused(key) -> None:  # type: ignore[no-untyped-def]
    head, _, sig = issue_token(key, SLEEP, NOW, 3600).rpartition(".")
    raw = base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4))
    short = base64.urlsafe_b64encode(raw[:60]).rstrip(b"=").decode()  # ES256 signatures are 64 bytes
    with pytest.raises(TokenError, match="signature does not verify"):
        decode_and_verify(f"{head}.{short}", key.public_key(), NOW)


def test_unsupported_critical_header_is_refused(key) -> None:  # type: ignore[no-untyped-def]
    # PyJWT will not even write such a header, so sign it by hand.
    token = issue_token(key, SLEEP, NOW, 3600)
    signing_input = _reencode({**_part(token, 0), "crit": ["exp"], "exp": 1}) + "." + token.split(".")[1]
    der = key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))
    signature = base64.urlsafe_b64encode(der_to_raw_signature(der, key.curve)).rstrip(b"=").decode()
    with pytest.raises(TokenError, match="critical extension"):
        decode_and_verify(f"{signing_input}.{signature}", key.public_key(), NOW)


def test_tokens_verify_with_plain_pyjwt(key) -> None:  # type: ignore[no-untyped-def]
    # Interoperability: any JWT library reads them as standard ES256 JWTs.
    token = issue_token(key, SLEEP, NOW, 3600)
    claims = jwt.decode(token, key.public_key(), algorithms=["ES256"], audience="istio-ca",
                        issuer=DEFAULT_ISSUER, options={"verify_exp": False, "verify_iat": False,
                                                        "verify_nbf": False})
    assert claims["sub"] == "system:serviceaccount:default:sleep"


def test_kid_is_checked_even_when_the_signature_verifies(key) -> None:  # type: ignore[no-untyped-def]
    token = issue_token(key, SLEEP, NOW, 3600)
    header, payload = _part(token, 0), _part(token, 1)
    with pytest.raises(TokenError, match="unknown key"):
        decode_and_verify(_sign(key, payload, {**header, "kid": "another-key"}), key.public_key(), NOW)
    del header["kid"]  # no kid at all: the signature alone decides
    assert decode_and_verify(_sign(key, payload, header), key.public_key(), NOW).identity.pod_name == "sleep-1"
