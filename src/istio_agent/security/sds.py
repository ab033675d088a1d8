"""The SDS server Envoy talks to: `envoy.service.secret.v3.SecretDiscoveryService` on a UDS.

Only StreamSecrets is served (Delta/Fetch → UNIMPLEMENTED, as upstream). Each
stream runs the sans-IO `SubscriptionState`; this file only moves messages
between it, the secret cache and the socket. Envoy opens one stream per secret
name, so pushes are fanned out to every stream and each decides for itself.

The socket Envoy dials is served by `PeerRelay` (`sds_relay.py`), which knows the
caller's uid, gid and groups; gRPC itself listens on a private socket in a 0700
directory beside it. Each stream is asked for its caller, and a `file-cert:` /
`file-root:` file is served only if that caller could read it itself (the
refusal ends the stream with PERMISSION_DENIED naming the file, and is logged).
`default`, `ROOTCA` and `file-root:system` are served to any caller, as upstream.
The server also tells the cache when a name's first stream subscribes and its
last one goes, so that files are watched only while someone wants them.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from istio_agent.protos import typeurls
from istio_agent.security.cache import SecretCache
from istio_agent.security.core import sds_wire
from istio_agent.security.core.sds_state import NameSubscribers, SdsProtocolError, SubscriptionState
from istio_agent.security.core.secrets import SecretError
from istio_agent.security.file_secrets import SecretRefused
from istio_agent.security.peercred import PeerCredentials
from istio_agent.security.sds_relay import PeerRelay, make_private_dir, reachable_path

log = logging.getLogger(__name__)

SOCKET_DIR_MODE = 0o750
SOCKET_MODE = 0o666
PRIVATE_SOCKET_NAME = "grpc"
SDS_SERVICE = "envoy.service.secret.v3.SecretDiscoveryService"
# What the metrics hook hears, as upstream's SDS server (pkg/xds) records it: (kind, seconds).
SDS_SENT = "sent"  # a response written to Envoy, and how long the write took (pilot_xds_send_time)
SDS_REJECTED = "rejected"  # Envoy NACKed a secret (pilot_total_xds_rejects{type="sds"})
SDS_EXPIRED_NONCE = "expired_nonce"  # a request answered an older response (pilot_xds_expired_nonce{type="sds"})
SDS_INTERNAL_ERROR = "internal_error"  # a stream's read failed other than by the client going away
SdsEventHook = Callable[[str, float], None]


@contextlib.contextmanager
def uds_address(path: Path) -> Iterator[str]:
    """A gRPC `unix:` target for `path`, even when it is longer than a socket address allows."""
    with reachable_path(path) as address:
        yield f"unix:{address}"


def private_socket_path(public: Path) -> Path:
    """Where the gRPC server listens behind the relay: `.<socket>.private/grpc` beside the public socket."""
    return public.parent / f".{public.name}.private" / PRIVATE_SOCKET_NAME



def random_nonce() -> str:
    """A random version-4 UUID in its text form, as upstream's SDS nonce (`uuid.New().String()`), made without
    the `uuid` module: it loads `platform` too, ~0.2 MB in every agent for one call per response."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # RFC 4122 variant
    text = raw.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"

class SdsServer:
    """grpc.aio SDS server over a Unix socket, fed by a SecretCache."""

    def __init__(self, cache: SecretCache, socket_path: Path, on_event: SdsEventHook | None = None) -> None:
        self.cache = cache
        self.on_event = on_event
        self.socket_path = socket_path
        self.private_socket_path = private_socket_path(socket_path)
        self._server: grpc.aio.Server | None = None
        self._relay: PeerRelay | None = None
        self._streams: dict[asyncio.Queue[tuple[str, Any]], SubscriptionState] = {}
        self._subscribers = NameSubscribers()
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
        make_private_dir(self.private_socket_path.parent)
        server = grpc.aio.server()
        # The messages are sds_wire's heads, not Envoy's generated classes (see there why).
        methods = {
            "StreamSecrets": grpc.stream_stream_rpc_method_handler(
                self.serve_stream, request_deserializer=sds_wire.DiscoveryRequest.FromString,
                response_serializer=sds_wire.DiscoveryResponse.SerializeToString),
            "DeltaSecrets": grpc.stream_stream_rpc_method_handler(self._delta_secrets),
            "FetchSecrets": grpc.unary_unary_rpc_method_handler(self._fetch_secrets),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SDS_SERVICE, methods),))
        with uds_address(self.private_socket_path) as target:
            server.add_insecure_port(target)
            await server.start()
        self._server = server
        relay = PeerRelay(self.socket_path, self.private_socket_path, SOCKET_MODE)
        try:
            await relay.start()
        except BaseException:
            await self.stop()
            raise
        self._relay = relay
        log.info("SDS server listening on %s", self.socket_path)

    async def stop(self, grace: float = 0.2) -> None:
        relay, self._relay = self._relay, None
        if relay is not None:
            await relay.stop()
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        shutil.rmtree(self.private_socket_path.parent, ignore_errors=True)

    async def _delta_secrets(self, _requests: AsyncIterator[Any], context: Any) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "DeltaSecrets not implemented")

    async def _fetch_secrets(self, _request: Any, context: Any) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "FetchSecrets not implemented")

    def push(self, name: str) -> None:
        """A secret changed: offer it to every stream (each forwards it only if it watches `name`)."""
        for queue in list(self._streams):
            queue.put_nowait(("push", name))

    def _event(self, kind: str, seconds: float = 0.0) -> None:
        if self.on_event is not None:
            try:
                self.on_event(kind, seconds)
            except Exception:
                log.exception("SDS: event hook failed")

    def _caller(self, context: Any) -> PeerCredentials | None:
        return self._relay.caller(context.peer()) if self._relay is not None else None

    def _subscriptions_changed(self, before: frozenset[str] | None, after: frozenset[str] | None) -> None:
        first, gone = self._subscribers.change(before, after)
        for name in first:
            self.cache.retain(name)
        for name in gone:
            self.cache.release(name)

    async def _response(self, names: tuple[str, ...], caller: PeerCredentials) -> Any:
        response = sds_wire.DiscoveryResponse(
            type_url=typeurls.SECRET,
            version_info=f"{dt.datetime.now(dt.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}/{next(self._versions)}",
            nonce=random_nonce(),
        )
        for name in names:
            try:
                item = await self.cache.get(name, caller)
            except SecretRefused as exc:
                raise SecretRefused(f"failed to generate secret for {name}: {exc}") from None
            except SecretError as exc:
                raise SecretError(f"failed to generate secret for {name}: {exc}") from None
            response.resources.add(type_url=typeurls.SECRET, value=sds_wire.secret_bytes(item))
        return response

    async def serve_stream(self, request_iterator: AsyncIterator[Any], context: Any) -> None:
        caller = self._caller(context)
        if caller is None:
            log.warning("SDS: refusing a stream from %s: it did not connect through %s", context.peer(),
                        self.socket_path)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"unknown SDS peer {context.peer()}: connect through {self.socket_path}")
            return
        events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        async def read() -> None:
            try:
                async for request in request_iterator:
                    events.put_nowait(("request", request))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the client went away, or its stream broke
                code = getattr(exc, "code", None)
                if callable(code) and code() not in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED):
                    self._event(SDS_INTERNAL_ERROR)
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
                        self._event(SDS_REJECTED)
                    before, expired = state.watched, state.expired_nonces
                    try:
                        names = state.on_request(list(value.resource_names), value.response_nonce, error,
                                                 value.node.id if value.HasField("node") else "")
                    except SdsProtocolError as exc:
                        log.warning("SDS: closing stream of %s (%s): %s", state.node_id or "unknown node",
                                    caller.describe(), exc)
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                        return
                    self._subscriptions_changed(before, state.watched)
                    if state.expired_nonces != expired:
                        self._event(SDS_EXPIRED_NONCE)
                else:
                    names = state.on_push(value)
                if not names:
                    continue
                try:
                    response = await self._response(names, caller)
                except SecretRefused as exc:
                    log.warning("SDS: refused, closing stream of %s (%s): %s", state.node_id, caller.describe(), exc)
                    await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
                    return
                except SecretError as exc:
                    log.warning("SDS: closing stream of %s: %s", state.node_id, exc)
                    await context.abort(grpc.StatusCode.UNKNOWN, str(exc))
                    return
                started = time.monotonic()
                await context.write(response)
                self._event(SDS_SENT, time.monotonic() - started)
                state.on_sent(response.nonce)
                log.debug("SDS: pushed %s to %s", ",".join(names), state.node_id)
        finally:
            self._streams.pop(events, None)
            self._subscriptions_changed(state.watched, None)
            reader.cancel()
