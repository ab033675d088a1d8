"""The XDS proxy: Envoy's ADS server on `<configPath>/XDS`, relaying to istiod.

Thin I/O around `StreamSession`. Each Envoy stream (SotW or Delta) gets its own
upstream channel and stream, dialled when the stream opens, so that a new
Envoy connection never inherits another stream's pending messages and a
restarted istiod is reached anew. Messages travel as raw bytes in both
directions (no serializer on either side).

Per stream, three tasks:
- Envoy → queue: read a request, let the session add the agent's own requests;
- queue → istiod: write requests upstream in order;
- istiod → Envoy: read one response, forward it and wait for the write to be
  accepted before reading the next (or hand a consumed type to its callback
  and queue the ACK). This keeps at most one response in the proxy, so memory
  stays bounded however large a push is; gRPC flow control pushes back on
  istiod. The request queue is unbounded, as upstream's is: requests are small
  and a bounded queue could deadlock both directions under load.

The first task to finish decides how the Envoy stream ends: an upstream error
ends it with that status (Envoy reconnects with its own backoff), Envoy
closing ends the upstream stream. Only the newest Envoy stream is kept: a new
one closes the previous, and health reports go to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from istio_agent.protos import nds_pb2, typeurls
from istio_agent.security.ca_client import keepalive_options
from istio_agent.xds import messages, routing, upstream
from istio_agent.xds.options import XdsProxyHooks, XdsProxyOptions
from istio_agent.xds.session import Consume, Drop, Health, StreamSession, ToEnvoy, apply_node_hook

log = logging.getLogger(__name__)


def _identity(data: bytes) -> bytes:
    return data


@dataclass
class ProxyStats:
    """Counters for metrics and tests (upstream exports similar `istio_agent_*` metrics)."""

    streams: int = 0
    upstream_failures: int = 0
    requests: int = 0  # requests from Envoy, forwarded upstream
    received: int = 0  # responses read from istiod
    responses: int = 0  # responses forwarded to Envoy
    consumed: int = 0
    nacked: int = 0
    dropped: int = 0


@dataclass(frozen=True, slots=True)
class _End:
    """How one side of a stream finished."""

    code: grpc.StatusCode
    details: str
    side: str


class XdsProxy:
    """ADS server for Envoy that forwards to istiod and consumes Istio's own types."""

    def __init__(self, options: XdsProxyOptions, hooks: XdsProxyHooks | None = None) -> None:
        self.options = options
        self.hooks = hooks or XdsProxyHooks()
        self.stats = ProxyStats()
        self._server: grpc.aio.Server | None = None
        self._current: _ProxiedStream | None = None
        self._health: Health | None = None
        self._next_id = 0
        consumed: set[str] = set()
        if options.dns_enabled and self.hooks.on_name_table is not None:
            consumed.add(typeurls.NAME_TABLE)
        if options.pcds_enabled and self.hooks.on_trust_bundle is not None:
            consumed.add(typeurls.PROXY_CONFIG)
        self.consumed = frozenset(consumed)

    # --- lifecycle --------------------------------------------------------------------------------------
    async def start(self) -> None:
        path = self.options.socket_path.absolute()
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a stale socket from a previous run would make bind fail
        settings = self.options.upstream
        # Upstream serves Envoy with the same keepalive parameters it dials istiod with.
        server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1),
            *keepalive_options(settings.keepalive_interval, settings.keepalive_timeout),
        ])
        methods = {
            "StreamAggregatedResources": grpc.stream_stream_rpc_method_handler(self._sotw),
            "DeltaAggregatedResources": grpc.stream_stream_rpc_method_handler(self._delta),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(routing.ADS_SERVICE, methods),))
        server.add_insecure_port(f"unix:{path}")
        await server.start()
        self._server = server
        log.info("XDS proxy listening on %s, upstream %s", path, self.options.upstream.address)

    async def stop(self) -> None:
        """End the current stream at once (Envoy is going away with the agent), then the server."""
        server, self._server = self._server, None
        if self._current is not None:
            self._current.superseded.set()
        if server is not None:
            await server.stop(self.options.stop_grace)
        with contextlib.suppress(FileNotFoundError):
            self.options.socket_path.absolute().unlink()

    # --- agent-facing API --------------------------------------------------------------------------------
    def set_health(self, healthy: bool, message: str = "") -> None:
        """Report the workload's health to istiod now (after LDS) and on every later stream.

        Call it on the proxy's event loop; it only queues a small request.
        """
        self._health = Health(healthy, message)
        if self._current is not None:
            self._current.report_health(self._health)

    @property
    def connected(self) -> bool:
        """Whether an Envoy stream is currently being proxied."""
        return self._current is not None

    # --- gRPC handlers ------------------------------------------------------------------------------------
    async def _sotw(self, _requests: Any, context: grpc.aio.ServicerContext) -> None:
        await self._serve(context, delta=False)

    async def _delta(self, _requests: Any, context: grpc.aio.ServicerContext) -> None:
        await self._serve(context, delta=True)

    async def _serve(self, context: grpc.aio.ServicerContext, delta: bool) -> None:
        self._next_id += 1
        stream = _ProxiedStream(self, self._next_id, delta, context)
        previous, self._current = self._current, stream
        if previous is not None:
            log.warning("XDS proxy: new Envoy stream %d replaces stream %d", stream.id, previous.id)
            previous.superseded.set()
        self.stats.streams += 1
        mode = "delta" if delta else "sotw"
        self._event("connect", mode)
        try:
            await stream.run()
        finally:
            self._event("disconnect", mode)
            if self._current is stream:
                self._current = None

    def _event(self, kind: str, detail: str) -> None:
        """Tell the metrics hook, if any; a failing hook is logged, never fatal to the stream."""
        if self.hooks.on_event is not None:
            try:
                self.hooks.on_event(kind, detail)
            except Exception:
                log.exception("XDS proxy: event hook failed")

    def _consume(self, item: Consume) -> str | None:
        """Hand a consumed resource to its callback; the error text for a NACK, or None to ACK."""
        try:
            if item.type_url == typeurls.NAME_TABLE and self.hooks.on_name_table is not None:
                self.hooks.on_name_table(nds_pb2.NameTable.FromString(item.value))
            elif item.type_url == typeurls.PROXY_CONFIG and self.hooks.on_trust_bundle is not None:
                self.hooks.on_trust_bundle(messages.trust_bundle(item.value))
        except Exception as exc:
            log.warning("XDS proxy: rejecting %s: %s", typeurls.short(item.type_url), exc)
            return str(exc) or type(exc).__name__
        return None


class _ProxiedStream:
    """One Envoy stream and its upstream twin."""

    def __init__(self, proxy: XdsProxy, stream_id: int, delta: bool, context: grpc.aio.ServicerContext) -> None:
        self.proxy = proxy
        self.id = stream_id
        self.delta = delta
        self.context = context
        self.session = StreamSession(delta=delta, consumed=proxy.consumed, health=proxy._health)
        self.outbox: asyncio.Queue[bytes] = asyncio.Queue()
        self.superseded = asyncio.Event()

    def report_health(self, health: Health) -> None:
        for data in self.session.on_health(health):
            self.outbox.put_nowait(data)

    async def run(self) -> None:
        settings = self.proxy.options.upstream
        try:
            channel = await upstream.dial(settings)
        except upstream.UpstreamError as exc:
            self.proxy.stats.upstream_failures += 1
            self.proxy._event("upstream_failure", "dial")
            log.warning("XDS proxy: failed to connect to upstream %s: %s", settings.address, exc)
            self.context.set_code(grpc.StatusCode.UNAVAILABLE)
            self.context.set_details(str(exc))
            return
        try:
            method = routing.DELTA_METHOD if self.delta else routing.SOTW_METHOD
            call = channel.stream_stream(method, request_serializer=_identity, response_deserializer=_identity)(
                metadata=upstream.call_metadata(settings)
            )
            log.info("XDS proxy: stream %d (%s) connected to %s", self.id, "delta" if self.delta else "sotw",
                     settings.address)
            end = await self._relay(call)
            call.cancel()
        finally:
            await channel.close()
        if end.side == "upstream" and end.code != grpc.StatusCode.OK:
            self.proxy.stats.upstream_failures += 1
            self.proxy._event("upstream_failure", end.code.name)
            log.info("XDS proxy: stream %d ended by %s: %s %s", self.id, end.side, end.code.name, end.details)
        if end.code != grpc.StatusCode.OK:
            self.context.set_code(end.code)
            self.context.set_details(end.details)

    async def _relay(self, call: Any) -> _End:
        readers = asyncio.create_task(self._from_upstream(call))
        writer = asyncio.create_task(self._to_upstream(call))
        downstream = asyncio.create_task(self._from_downstream())
        superseded = asyncio.create_task(self._wait_superseded())
        tasks = [readers, writer, downstream, superseded]  # priority order when several end at once
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, _End):
                return result
            if isinstance(result, Exception):  # a bug, not a peer's doing: say so, end the stream
                log.error("XDS proxy: stream %d failed", self.id, exc_info=result)
                return _End(grpc.StatusCode.INTERNAL, f"xds proxy error: {result}", "proxy")
        return _End(grpc.StatusCode.CANCELLED, "stream cancelled", "proxy")

    async def _wait_superseded(self) -> _End:
        await self.superseded.wait()
        return _End(grpc.StatusCode.OK, "replaced by a newer stream or stopped", "proxy")

    async def _from_downstream(self) -> _End:
        """Envoy → outbox. Ends when Envoy half-closes, sends garbage, or goes away."""
        hook = self.proxy.hooks.node_hook
        first = True
        while True:
            try:
                data = await self.context.read()
            except Exception as exc:  # the RPC was torn down under us
                return _End(grpc.StatusCode.CANCELLED, f"downstream read failed: {exc}", "downstream")
            if data is grpc.aio.EOF:
                return _End(grpc.StatusCode.OK, "", "downstream")
            assert isinstance(data, bytes)
            try:
                if first and hook is not None:
                    data = apply_node_hook(data, self.delta, hook)
                first = False
                head = messages.request_head(data, self.delta)
                for out in self.session.upstream_requests(head, data):
                    self.outbox.put_nowait(out)
                if head.error is not None:  # Envoy's NACK, for the metrics hook
                    self.proxy._event("envoy_nack", head.type_url)
            except messages.DecodeError as exc:
                return _End(grpc.StatusCode.INVALID_ARGUMENT, str(exc), "downstream")
            self.proxy.stats.requests += 1

    async def _to_upstream(self, call: Any) -> _End:
        """Outbox → istiod, in order. Health reports wait for LDS (the session never emits them earlier)."""
        while True:
            data = await self.outbox.get()
            try:
                await call.write(data)
            except grpc.aio.AioRpcError as exc:
                return _End(exc.code(), exc.details() or "", "upstream")
            except Exception:
                code = await call.code()
                return _End(code, await call.details() or "", "upstream")

    async def _from_upstream(self, call: Any) -> _End:
        """istiod → Envoy, one response at a time (the next read waits for the forward)."""
        while True:
            try:
                data = await call.read()
            except grpc.aio.AioRpcError as exc:
                return _End(exc.code(), exc.details() or "", "upstream")
            if data is grpc.aio.EOF:
                return _End(await call.code(), await call.details() or "", "upstream")
            self.proxy.stats.received += 1
            try:
                action = self.session.on_response(data)
            except messages.DecodeError as exc:
                return _End(grpc.StatusCode.INTERNAL, f"from upstream: {exc}", "upstream")
            if isinstance(action, ToEnvoy):
                try:
                    await self.context.write(action.data)
                except Exception as exc:
                    return _End(grpc.StatusCode.CANCELLED, f"downstream write failed: {exc}", "downstream")
                self.proxy.stats.responses += 1
                self.proxy._event("push", action.type_url)
            elif isinstance(action, Consume):
                error = self.proxy._consume(action)
                self.proxy.stats.consumed += 1
                self.proxy._event("push", action.type_url)
                if error is not None:
                    self.proxy.stats.nacked += 1
                    self.proxy._event("agent_nack", action.type_url)
                self.outbox.put_nowait(self.session.ack(action, error))
            elif isinstance(action, Drop):
                self.proxy.stats.dropped += 1
                log.debug("XDS proxy: dropped %s response: %s", typeurls.short(action.type_url), action.reason)
