"""TokenReview: whether a service-account token istiod-local issued is good, as the apiserver answers (pure).

istiod, given a Kubernetes client, authenticates an agent's CSR and XDS stream
by sending the agent's bearer token to the API in a TokenReview with the
audiences it accepts (`TOKEN_AUDIENCES`, default `istio-ca`); the answer's
user name (`system:serviceaccount:<ns>:<sa>`) is the caller's identity, and
the pod name and uid in `extra` bind it to a pod. istiod-local is the token
issuer here, so it answers from the same key and rules its own CA uses:
signature, issuer, time window, and one of the requested audiences (the API's
own audience, the issuer, when the review names none). A bad token is not an
error: the review says `authenticated: false` with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from istiod_local.controlplane.kubeapi import errors
from istiod_local.controlplane.tokens import TokenClaims, TokenError

POD_NAME_KEY = "authentication.kubernetes.io/pod-name"
POD_UID_KEY = "authentication.kubernetes.io/pod-uid"
MAX_AUDIENCES = 16
MAX_TOKEN_BYTES = 64 * 1024

Verify = Callable[[str, str], TokenClaims]  # (token, audience) -> claims, TokenError when refused


def review(body: Any, verify: Verify, default_audience: str) -> dict[str, Any]:
    """The TokenReview the API answers with (201) for the one `body` asks for."""
    if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
        raise errors.bad_request("the body of the request is not a TokenReview")
    spec = body["spec"]
    token = spec.get("token")
    audiences = spec.get("audiences") or []
    if not isinstance(token, str) or not token:
        raise errors.invalid("TokenReview", "", "spec.token: Required value", resource="tokenreviews")
    if len(token) > MAX_TOKEN_BYTES:
        raise errors.invalid("TokenReview", "", "spec.token: Too long", resource="tokenreviews")
    if not isinstance(audiences, list) or not all(isinstance(a, str) for a in audiences) \
            or len(audiences) > MAX_AUDIENCES:
        raise errors.bad_request("spec.audiences must be a list of at most 16 strings")
    status: dict[str, Any] = {"user": {}}
    reasons = []
    for audience in audiences or [default_audience]:
        try:
            claims = verify(token, audience)
        except TokenError as exc:
            reasons.append(str(exc))
            continue
        status = _authenticated(claims, audience)
        break
    else:
        status["authenticated"] = False
        status["error"] = "[invalid bearer token, " + "; ".join(dict.fromkeys(reasons)) + "]"
    given = body.get("metadata")
    meta: dict[str, Any] = given if isinstance(given, dict) else {}
    return {"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {k: v for k, v in meta.items() if k in ("name", "generateName")},
            "spec": {"token": token, **({"audiences": audiences} if audiences else {})}, "status": status}


def _authenticated(claims: TokenClaims, audience: str) -> dict[str, Any]:
    identity = claims.identity
    user: dict[str, Any] = {"username": identity.subject,
                            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{identity.namespace}",
                                       "system:authenticated"]}
    if identity.service_account_uid:
        user["uid"] = identity.service_account_uid
    extra = {}
    if identity.pod_name:
        extra[POD_NAME_KEY] = [identity.pod_name]
    if identity.pod_uid:
        extra[POD_UID_KEY] = [identity.pod_uid]
    if extra:
        user["extra"] = extra
    return {"authenticated": True, "user": user, "audiences": [audience]}
