"""Who may fetch a proxy's config: the same service-account tokens the CA accepts.

istiod authenticates xDS on its TLS port with the pod's projected token and
checks that the token's namespace (and service account, when the proxy
states one) matches the node asking. istiod-local does the same with its
`TokenVerifier`; the plaintext port (15010) stays open, as upstream's does.

`authenticate` returns the verified identity (upstream's `VerifiedIdentity`),
which WorkloadEntry auto-registration checks against the entry. On the open
plaintext port a token is optional: a valid one that matches the node still
gives the stream an identity, anything else gives it none (never a refusal).
"""

from __future__ import annotations

from typing import Protocol

import grpc

from istiod_local.controlplane.tokens import TokenError, TokenIdentity, TokenVerifier
from istiod_local.controlplane.xds.proxy import Proxy


class AuthError(Exception):
    """The stream is refused; the message becomes the UNAUTHENTICATED status detail."""


class XdsAuthenticator(Protocol):
    def authenticate(self, proxy: Proxy, context: grpc.aio.ServicerContext, now: float) -> TokenIdentity | None:
        ...


def bearer_token(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key.lower() == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            if text.startswith("Bearer "):
                return text[len("Bearer "):].strip()
    return ""


def is_tls(context: grpc.aio.ServicerContext) -> bool:
    security = context.auth_context().get("transport_security_type", [])
    return any(value in (b"ssl", "ssl") for value in security)


class TokenAuthenticator:
    """Require a valid token on TLS connections (and on plaintext ones when `plaintext_too`)."""

    def __init__(self, verifier: TokenVerifier, plaintext_too: bool = False) -> None:
        self._verifier = verifier
        self._plaintext_too = plaintext_too

    def authenticate(self, proxy: Proxy, context: grpc.aio.ServicerContext, now: float) -> TokenIdentity | None:
        """The token's identity; AuthError when the stream must be refused."""
        if not self._plaintext_too and not is_tls(context):
            try:
                return self._check(proxy, bearer_token(context), now)  # no token, or a bad one: anonymous
            except AuthError:
                return None
        return self._check(proxy, bearer_token(context), now)

    def _check(self, proxy: Proxy, token: str, now: float) -> TokenIdentity:
        if not token:
            raise AuthError("no bearer token (authorization: Bearer <service-account token>)")
        try:
            claims = self._verifier.verify(token, now)
        except TokenError as exc:
            raise AuthError(f"token refused: {exc}") from None
        identity = claims.identity
        if identity.namespace != proxy.namespace:
            raise AuthError(f"token for namespace {identity.namespace!r} cannot fetch config of {proxy.id!r}")
        if proxy.service_account and identity.service_account != proxy.service_account:
            raise AuthError(f"token for service account {identity.service_account!r} cannot fetch config of "
                            f"{proxy.id!r} (service account {proxy.service_account!r})")
        return identity
