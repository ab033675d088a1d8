"""The CA client: `istio.v1.auth.IstioCertificateService/CreateCertificate` over grpc.aio.

Connection rules follow upstream's citadel client: plaintext to istiod's
insecure port 15010, TLS elsewhere with a root from `CA_ROOT_CA` /
`XDS_ROOT_CA` (`SYSTEM` = the OS bundle) or the mounted
`./var/run/secrets/istio/root-cert.pem`, and a server name taken from the
address (`localhost` stands for `istiod.istio-system.svc`; `ISTIOD_SAN` wins).
The bearer token is re-read on every call because Kubernetes rotates it on disk.
A token file that cannot be read means no authorization header (as upstream),
with a warning naming the path, so that the CA's "no authorization header"
refusal is not the only clue; a root file holding no certificate is refused by
name before any connection is tried.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Protocol

import grpc
import grpc.aio
from google.protobuf import struct_pb2

from istio_agent.netaddr import split_host_optional_port
from istio_agent.protos import istioca_pb2, istioca_pb2_grpc
from istio_agent.security.core.rotation import CA_MAX_ATTEMPTS, ca_retry_delay
from istio_agent.security.core.secrets import SecretError, pem_certificates, system_bundle_path
from istio_agent.security.credentials import CredentialError, bearer_token
from istio_agent.security.options import (
    CA_ROOT_DEFAULT_PATH,
    CERT_CHAIN_FILE,
    KEY_FILE,
    SYSTEM_ROOTS,
    SecurityOptions,
)

log = logging.getLogger(__name__)

ISTIOD_SERVICE_NAME = "istiod.istio-system.svc"

# gRPC's default reconnect backoff grows to 120 s; a CA that comes back must be
# found within seconds so that rotation resumes well before the certificate expires.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5000),
)

# Codes upstream's retry interceptor treats as transient.
RETRYABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.CANCELLED,
    }
)


def is_retryable(code: grpc.StatusCode | None) -> bool:
    return code in RETRYABLE_CODES


class CaError(SecretError):
    """The CA refused or could not be reached; `code` is the final gRPC status, if any."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class CertificateSigner(Protocol):
    """What the secret cache needs from a CA: sign a PEM CSR, return the chain (leaf first, root last)."""

    async def sign(self, csr_pem: bytes, ttl_seconds: int) -> list[str]: ...

    async def close(self) -> None: ...


def tls_server_name(address: str, istiod_san: str = "") -> str:
    """The name the CA's certificate must carry: ISTIOD_SAN, else the address host (`localhost` → istiod)."""
    if istiod_san:
        return istiod_san
    host, _ = split_host_optional_port(address)
    if host == "localhost" or host.startswith("localhost."):
        return ISTIOD_SERVICE_NAME
    return host


def resolve_ca_root(options: SecurityOptions) -> Path:
    """The root bundle used to verify the CA, or SecretError naming the missing file."""
    configured = options.ca_root_ca
    if configured == SYSTEM_ROOTS:
        bundle = system_bundle_path()
        if bundle is None:
            raise SecretError("root CA for the CA is SYSTEM but no OS certificate bundle was found")
        return bundle
    path = options.path(configured or CA_ROOT_DEFAULT_PATH)
    if not path.is_file():
        raise SecretError(f"root CA file for CA does not exist {path}")
    return path


def target_name_override(address: str, server_name: str) -> list[tuple[str, str]]:
    """The channel option that makes gRPC verify `server_name` when it is not the host dialled."""
    if server_name == split_host_optional_port(address)[0]:
        return []
    return [("grpc.ssl_target_name_override", server_name)]


def client_key_and_chain(folder: Path) -> tuple[bytes | None, bytes | None]:
    """key.pem and cert-chain.pem from `folder` for mTLS to istiod; (None, None) unless both are there."""
    return read_key_pair(folder / KEY_FILE, folder / CERT_CHAIN_FILE)


def read_key_pair(key: Path, chain: Path) -> tuple[bytes | None, bytes | None]:
    """A client key and its chain for mTLS to istiod; (None, None) unless both files are there."""
    if key.is_file() and chain.is_file():
        return key.read_bytes(), chain.read_bytes()
    return None, None


def keepalive_options(interval: float, timeout: float) -> list[tuple[str, int]]:
    """gRPC keepalive on connections to istiod (upstream's GRPC_KEEPALIVE_INTERVAL / _TIMEOUT client parameters)."""
    return [("grpc.keepalive_time_ms", int(interval * 1000)), ("grpc.keepalive_timeout_ms", int(timeout * 1000))]


def istiod_call_metadata(cluster_id: str, headers: Iterable[tuple[str, str]],
                         token: str | None) -> list[tuple[str, str]]:
    """What every call to istiod carries: ClusterID, the extra headers, the bearer token if any (keys lower case)."""
    metadata: list[tuple[str, str]] = [("clusterid", cluster_id), *headers]
    if token:
        metadata.append(("authorization", f"Bearer {token}"))
    return metadata


def ca_metadata(options: SecurityOptions, token: str | None) -> list[tuple[str, str]]:
    """Call metadata: ClusterID, CA_HEADER_* headers and the bearer token."""
    return istiod_call_metadata(options.cluster_id, options.ca_headers, token)


def require_certificates(pem: bytes, path: Path, what: str) -> bytes:
    """`pem` if it holds at least one certificate; else SecretError naming `path` (gRPC would only say the
    handshake failed)."""
    if not pem_certificates(pem):
        raise SecretError(f"{what} {path} holds no certificate")
    return pem


class CaClient:
    """A grpc.aio client to the CA, with upstream's retry policy; one channel, rebuilt when its root changes."""

    def __init__(
        self,
        options: SecurityOptions,
        *,
        rand: Callable[[], float] = random.random,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_retry: Callable[[], None] | None = None,
    ) -> None:
        self.options = options
        self._on_retry = on_retry  # told before each retry (upstream's num_outgoing_retries{request_type="csr"})
        self._rand = rand
        self._sleep = sleep
        self._channel: grpc.aio.Channel | None = None
        self._stub: istioca_pb2_grpc.IstioCertificateServiceStub | None = None
        self._channel_key: bytes | None = None

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stub = None

    def _credentials(self) -> tuple[grpc.ChannelCredentials, bytes, bytes, Path]:
        """Channel credentials, the trust material they hold (to notice a change), the root and its path."""
        root_path = resolve_ca_root(self.options)
        root = root_path.read_bytes()
        key: bytes | None = None
        cert: bytes | None = None
        if self.options.prov_cert:
            key, cert = client_key_and_chain(self.options.path(self.options.prov_cert))
        creds = grpc.ssl_channel_credentials(root_certificates=root, private_key=key, certificate_chain=cert)
        return creds, root + (key or b"") + (cert or b""), root, root_path

    def _ensure_stub(self) -> istioca_pb2_grpc.IstioCertificateServiceStub:
        """The stub, (re)building the channel when the trust material on disk changed."""
        address = self.options.ca_address
        if self.options.plaintext_ca:
            if self._stub is None:
                self._channel = grpc.aio.insecure_channel(address, options=self._channel_options())
                self._stub = istioca_pb2_grpc.IstioCertificateServiceStub(self._channel)
            return self._stub
        creds, material, root, root_path = self._credentials()
        if self._stub is not None and material == self._channel_key:
            return self._stub
        require_certificates(root, root_path, "root CA file for CA")  # checked when it changes, not per call
        if self._channel is not None:
            old = self._channel
            asyncio.get_running_loop().create_task(old.close())
        channel_options: list[tuple[str, str | int]] = [
            *self._channel_options(), *target_name_override(address, tls_server_name(address, self.options.istiod_san))]
        self._channel = grpc.aio.secure_channel(address, creds, options=channel_options)
        self._stub = istioca_pb2_grpc.IstioCertificateServiceStub(self._channel)
        self._channel_key = material
        return self._stub

    def _channel_options(self) -> list[tuple[str, str | int]]:
        return [*CHANNEL_OPTIONS, *keepalive_options(self.options.keepalive_interval, self.options.keepalive_timeout)]

    def _request(self, csr_pem: bytes, ttl_seconds: int) -> istioca_pb2.IstioCertificateRequest:
        request = istioca_pb2.IstioCertificateRequest(csr=csr_pem.decode(), validity_duration=int(ttl_seconds))
        if self.options.cert_signer:
            meta = struct_pb2.Struct()
            meta.update({"CertSigner": self.options.cert_signer})
            request.metadata.CopyFrom(meta)
        return request

    async def sign(self, csr_pem: bytes, ttl_seconds: int) -> list[str]:
        """Send the CSR; retry transient failures up to 5 calls in all; return the chain, leaf first."""
        request = self._request(csr_pem, ttl_seconds)
        last: CaError | None = None
        for attempt in range(CA_MAX_ATTEMPTS):
            delay = ca_retry_delay(attempt, self._rand())
            if attempt and self._on_retry is not None:
                self._on_retry()
            if delay:
                await self._sleep(delay)
            stub = self._ensure_stub()
            try:
                token = await bearer_token(self.options.credentials, self.options.token_path)
            except CredentialError as exc:  # the platform gave no token: this attempt fails, as a transient one
                last = CaError(f"CreateCertificate to {self.options.ca_address}: {exc}", grpc.StatusCode.UNAVAILABLE)
                log.debug("CA call %d/%d failed, retrying: %s", attempt + 1, CA_MAX_ATTEMPTS, last)
                continue
            metadata = ca_metadata(self.options, token)
            try:
                response = await stub.CreateCertificate(
                    request, metadata=metadata, timeout=self.options.ca_call_timeout
                )
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                note = "" if token else f" (no bearer token was sent: {self.options.token_path} is missing or empty)"
                last = CaError(
                    f"CreateCertificate to {self.options.ca_address} failed: {code.name}: {exc.details()}{note}", code)
                if not is_retryable(code):
                    raise last from None
                log.debug("CA call %d/%d failed, retrying: %s", attempt + 1, CA_MAX_ATTEMPTS, last)
                continue
            chain = list(response.cert_chain)
            if len(chain) < 2:
                raise CaError("invalid empty CertChain")
            return chain
        assert last is not None
        raise last
