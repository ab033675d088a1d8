"""How the XDS proxy reaches istiod: address, trust, server name, call metadata.

The rules mirror the CA client's (`security/ca_client.py`, whose helpers this
reuses): plaintext when the address ends in `:15010`, else TLS verified
against `XDS_ROOT_CA` (`SYSTEM` = the OS bundle) or the mounted
`./var/run/secrets/istio/root-cert.pem`, with the server name taken from the
address host (`localhost` stands for `istiod.istio-system.svc`; `ISTIOD_SAN`
wins). Every call carries `ClusterID`, the `XDS_HEADER_*` headers and the
bearer token, had anew per call (`security/credentials.py`: the token file, which
Kubernetes rotates, or the GCE metadata server's identity token).

Trust material is read at each dial, so a rotated root is picked up by the next
stream without a watcher.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from istio_agent.netaddr import split_host_optional_port
from istio_agent.security.ca_client import (
    istiod_call_metadata,
    keepalive_options,
    read_key_pair,
    target_name_override,
    tls_server_name,
)
from istio_agent.security.core.secrets import pem_certificates, system_bundle_path
from istio_agent.security.credentials import CredentialError, bearer_token
from istio_agent.security.options import CA_ROOT_DEFAULT_PATH, SYSTEM_ROOTS, TOKEN_PATH, CredentialSource

PLAINTEXT_PORT = 15010


class UpstreamError(Exception):
    """istiod could not be dialled (bad trust settings, unreachable, timeout)."""


@dataclass(frozen=True)
class UpstreamSettings:
    """Where istiod is and how to authenticate to it."""

    address: str
    workdir: Path = field(default_factory=Path.cwd)
    root_ca: str = ""  # XDS_ROOT_CA: a file, SYSTEM, or "" for the mounted istiod root
    istiod_san: str = ""
    token_path: str = TOKEN_PATH
    send_token: bool = True  # XDS_AUTH
    credentials: CredentialSource = field(default_factory=CredentialSource)  # CREDENTIAL_FETCHER_TYPE
    cluster_id: str = "Kubernetes"
    headers: tuple[tuple[str, str], ...] = ()  # XDS_HEADER_<K>=v, names already lower case
    client_key: str = ""  # mTLS to istiod: PROV_CERT's key.pem, or ISTIO_META_TLS_CLIENT_KEY with FILE_MOUNTED_CERTS
    client_chain: str = ""  # ... and the matching cert-chain.pem / ISTIO_META_TLS_CLIENT_CERT_CHAIN
    keepalive_interval: float = 30.0  # GRPC_KEEPALIVE_INTERVAL
    keepalive_timeout: float = 10.0  # GRPC_KEEPALIVE_TIMEOUT
    dial_timeout: float = 5.0
    insecure: bool = False  # ProxyConfig controlPlaneAuthPolicy NONE

    def path(self, pod_path: str) -> Path:
        candidate = Path(pod_path)
        return candidate if candidate.is_absolute() else self.workdir / candidate

    @property
    def plaintext(self) -> bool:
        return self.insecure or split_host_optional_port(self.address)[1] == PLAINTEXT_PORT

    @property
    def server_name(self) -> str:
        return tls_server_name(self.address, self.istiod_san)


def root_certificates(settings: UpstreamSettings) -> bytes | None:
    """PEM roots to verify istiod with; None means gRPC's default roots (SYSTEM with no OS bundle)."""
    if settings.root_ca == SYSTEM_ROOTS:
        bundle = system_bundle_path()
        return bundle.read_bytes() if bundle is not None else None
    path = settings.path(settings.root_ca or CA_ROOT_DEFAULT_PATH)
    try:
        roots = path.read_bytes()
    except OSError as exc:
        raise UpstreamError(f"root CA for XDS {path}: {exc.strerror or exc}") from None
    if not pem_certificates(roots):  # else gRPC reports only a failed handshake
        raise UpstreamError(f"root CA for XDS {path} holds no certificate")
    return roots


def channel_credentials(settings: UpstreamSettings) -> grpc.ChannelCredentials:
    roots = root_certificates(settings)
    key: bytes | None = None
    chain: bytes | None = None
    if settings.client_key and settings.client_chain:
        key, chain = read_key_pair(settings.path(settings.client_key), settings.path(settings.client_chain))
    return grpc.ssl_channel_credentials(root_certificates=roots, private_key=key, certificate_chain=chain)


def channel_options(settings: UpstreamSettings) -> list[tuple[str, Any]]:
    """Channel arguments: no receive cap (pushes can be huge), a private connection per channel.

    A local subchannel pool gives each proxied stream its own connection, as upstream
    dials a fresh ClientConn per Envoy stream, so a restarted istiod is reached anew.
    """
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", -1),
        ("grpc.max_send_message_length", -1),
        ("grpc.use_local_subchannel_pool", 1),
        *keepalive_options(settings.keepalive_interval, settings.keepalive_timeout),
    ]
    if not settings.plaintext:
        options += target_name_override(settings.address, settings.server_name)
    return options


async def call_metadata(settings: UpstreamSettings) -> list[tuple[str, str]]:
    """ClusterID, XDS_HEADER_* and the bearer token (had now: read from its file, omitted when the file is
    absent, or asked of the GCE metadata server); UpstreamError when the platform gives no token."""
    try:
        token = await bearer_token(settings.credentials, settings.path(settings.token_path)) \
            if settings.send_token else None
    except CredentialError as exc:
        raise UpstreamError(str(exc)) from None
    return istiod_call_metadata(settings.cluster_id, settings.headers, token)


async def dial(settings: UpstreamSettings) -> grpc.aio.Channel:
    """A connected channel to istiod, or UpstreamError after `dial_timeout` seconds."""
    options = channel_options(settings)
    if settings.plaintext:
        channel = grpc.aio.insecure_channel(settings.address, options=options)
    else:
        channel = grpc.aio.secure_channel(settings.address, channel_credentials(settings), options=options)
    try:
        await asyncio.wait_for(channel.channel_ready(), settings.dial_timeout)
    except TimeoutError:
        await channel.close()
        raise UpstreamError(
            f"cannot connect to {settings.address} within {settings.dial_timeout:g}s"
        ) from None
    except BaseException:
        await channel.close()
        raise
    return channel
