"""The SDS server Envoy talks to: `envoy.service.secret.v3.SecretDiscoveryService` on a UDS.

Only StreamSecrets is served (Delta/Fetch → UNIMPLEMENTED, as upstream). Each
stream runs the sans-IO `SubscriptionState`; this file only moves messages
between it, the secret cache and the socket. Envoy opens one stream per secret
name, so pushes are fanned out to every stream and each decides for itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import logging
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.secret.v3 import sds_pb2_grpc

from istio_agent.protos import typeurls
from istio_agent.security.cache import SecretCache
from istio_agent.security.sds_state import SdsProtocolError, SubscriptionState
from istio_agent.security.secrets import SecretError, SecretItem

log = logging.getLogger(__name__)

SOCKET_DIR_MODE = 0o750
SOCKET_MODE = 0o666
# sun_path holds 108 bytes including the terminating NUL.
MAX_UDS_PATH = 107


@contextlib.contextmanager
def uds_address(path: Path) -> Iterator[str]:
    """A gRPC `unix:` target for `path`, even when it is longer than a socket address allows.

    Pods' working directories can be deep; a long path is reached through an open
    descriptor of its directory (`/proc/self/fd/N/<name>`), which the kernel
    resolves at bind/connect time. The descriptor is only needed until then.
    """
    if len(os.fsencode(str(path))) <= MAX_UDS_PATH:
        yield f"unix:{path}"
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"unix:/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def to_envoy_secret(item: SecretItem) -> secret_pb2.Secret:
    """`default`-like items become tls_certificate (chain + key); bundles become validation_context.trusted_ca."""
    secret = secret_pb2.Secret(name=item.resource_name)
    if item.is_root:
        secret.validation_context.trusted_ca.inline_bytes = item.root_cert
    else:
        secret.tls_certificate.certificate_chain.inline_bytes = item.cert_chain
        secret.tls_certificate.private_key.inline_bytes = item.private_key
    return secret


class _Servicer(sds_pb2_grpc.SecretDiscoveryServiceServicer):
    def __init__(self, server: SdsServer) -> None:
        self._server = server

    async def StreamSecrets(self, request_iterator: AsyncIterator[Any], context: Any) -> None:
        await self._server.serve_stream(request_iterator, context)

    async def DeltaSecrets(self, request_iterator: AsyncIterator[Any], context: Any) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "DeltaSecrets not implemented")

    async def FetchSecrets(self, request: Any, context: Any) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "FetchSecrets not implemented")


class SdsServer:
    """grpc.aio SDS server over a Unix socket, fed by a SecretCache."""

    def __init__(self, cache: SecretCache, socket_path: Path) -> None:
        self.cache = cache
        self.socket_path = socket_path
        self._server: grpc.aio.Server | None = None
        self._streams: dict[asyncio.Queue[tuple[str, Any]], SubscriptionState] = {}
        self._versions = itertools.count(1)
        cache.on_update(self.push)

    @property
    def stream_count(self) -> int:
        return len(self._streams)

    def subscriptions(self) -> list[tuple[str, frozenset[str]]]:
        """(node id, watched names) of every open stream, for diagnostics."""
        return [(state.node_id, state.watched or frozenset()) for state in self._streams.values()]

    async def start(self) -> None:
        directory = self.socket_path.parent
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            os.chmod(directory, SOCKET_DIR_MODE)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = grpc.aio.server()
        sds_pb2_grpc.add_SecretDiscoveryServiceServicer_to_server(_Servicer(self), server)
        with uds_address(self.socket_path) as target:
            server.add_insecure_port(target)
            await server.start()
        os.chmod(self.socket_path, SOCKET_MODE)
        self._server = server
        log.info("SDS server listening on %s", self.socket_path)

    async def stop(self, grace: float = 0.2) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def push(self, name: str) -> None:
        """A secret changed: offer it to every stream (each forwards it only if it watches `name`)."""
        for queue in list(self._streams):
            queue.put_nowait(("push", name))

    async def _response(self, names: tuple[str, ...]) -> discovery_pb2.DiscoveryResponse:
        response = discovery_pb2.DiscoveryResponse(
            type_url=typeurls.SECRET,
            version_info=f"{dt.datetime.now(dt.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}/{next(self._versions)}",
            nonce=str(uuid.uuid4()),
        )
        for name in names:
            try:
                item = await self.cache.get(name)
            except SecretError as exc:
                raise SecretError(f"failed to generate secret for {name}: {exc}") from None
            response.resources.add().Pack(to_envoy_secret(item))
        return response

    async def serve_stream(self, request_iterator: AsyncIterator[Any], context: Any) -> None:
        events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        async def read() -> None:
            try:
                async for request in request_iterator:
                    events.put_nowait(("request", request))
            except Exception as exc:  # the client went away
                log.debug("SDS stream read ended: %s", exc)
            events.put_nowait(("end", None))

        reader = asyncio.get_running_loop().create_task(read())
        state = SubscriptionState()
        self._streams[events] = state
        try:
            while True:
                kind, value = await events.get()
                if kind == "end":
                    return
                if kind == "request":
                    error = value.error_detail.message if value.HasField("error_detail") else None
                    if error is not None:
                        log.warning("SDS: Envoy rejected %s: %s", list(value.resource_names), error)
                    try:
                        names = state.on_request(list(value.resource_names), value.response_nonce, error,
                                                 value.node.id if value.HasField("node") else "")
                    except SdsProtocolError as exc:
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                        return
                else:
                    names = state.on_push(value)
                if not names:
                    continue
                try:
                    response = await self._response(names)
                except SecretError as exc:
                    log.warning("SDS: closing stream of %s: %s", state.node_id, exc)
                    await context.abort(grpc.StatusCode.UNKNOWN, str(exc))
                    return
                await context.write(response)
                state.on_sent(response.nonce)
                log.debug("SDS: pushed %s to %s", ",".join(names), state.node_id)
        finally:
            self._streams.pop(events, None)
            reader.cancel()
