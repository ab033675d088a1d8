"""Plumbing of the identity tests: pod options against istiod-local, an SDS client driven like Envoy.

istiod-local itself is the tier's `istiod` fixture (`launchers.IstiodLocal`):
`stop()` then `start()` brings it back at the same address, as a restarted
istiod would come back.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path

import grpc
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.secret.v3 import sds_pb2_grpc
from launchers import IstiodLocal

from istio_agent.pki import certs
from istio_agent.security.options import SecurityOptions

SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
NODE_ID = "sidecar~127.0.0.1~sleep-1.default~default.svc.cluster.local"


def sleep_pod(istiod: IstiodLocal, pod: Path) -> Path:
    """A `sleep-1` pod directory (service account sleep) with the mounted root and token."""
    return istiod.pod_files(pod, service_account="sleep", pod="sleep-1")


def token_path(pod: Path) -> Path:
    return pod / "var/run/secrets/tokens/istio-token"


def token_expiry(token: str) -> float:
    payload = token.split(".")[1]
    return float(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["exp"])


def pod_options(pod: Path, istiod: IstiodLocal, **overrides: object) -> SecurityOptions:
    values: dict[str, object] = dict(
        workdir=pod, namespace="default", service_account="sleep", ca_address=istiod.secure_address,
        secret_ttl=6.0, grace_period_ratio=0.5, grace_period_ratio_jitter=0.0,
        retry_initial=0.1, retry_max=0.5, file_poll_interval=0.1, key_algorithm="ECDSA",
    )
    values.update(overrides)
    return SecurityOptions(**values)  # type: ignore[arg-type]


def leaf_of(chain_pem: bytes) -> certs.x509.Certificate:
    return certs.load_pem_chain(chain_pem)[0]


class SdsClient:
    """One StreamSecrets stream to the agent's UDS, driven request by request like Envoy does."""

    def __init__(self, socket_path: Path) -> None:
        # Reach long paths through a directory descriptor held for the stream's lifetime.
        self._dir_fd = os.open(socket_path.parent, os.O_RDONLY | os.O_DIRECTORY)
        self.channel = grpc.aio.insecure_channel(f"unix:/proc/self/fd/{self._dir_fd}/{socket_path.name}")
        self.stub = sds_pb2_grpc.SecretDiscoveryServiceStub(self.channel)
        self.call = self.stub.StreamSecrets()

    async def request(self, names: list[str], nonce: str = "", error: str | None = None,
                      node: bool = True) -> None:
        request = discovery_pb2.DiscoveryRequest(type_url=SECRET_TYPE, resource_names=names, response_nonce=nonce)
        if node:
            request.node.id = NODE_ID
        if error is not None:
            request.error_detail.code = 3
            request.error_detail.message = error
        await self.call.write(request)

    async def read(self, timeout: float = 20.0) -> discovery_pb2.DiscoveryResponse:
        response = await asyncio.wait_for(self.call.read(), timeout)
        assert response is not grpc.aio.EOF, "stream ended"
        assert isinstance(response, discovery_pb2.DiscoveryResponse)
        return response

    async def close(self) -> None:
        self.call.cancel()
        await self.channel.close()
        os.close(self._dir_fd)


def secrets_of(response: discovery_pb2.DiscoveryResponse) -> dict[str, secret_pb2.Secret]:
    out: dict[str, secret_pb2.Secret] = {}
    for resource in response.resources:
        assert resource.type_url == SECRET_TYPE
        secret = secret_pb2.Secret()
        resource.Unpack(secret)
        out[secret.name] = secret
    return out

