"""The XDS proxy: Envoy's ADS server on `<configPath>/XDS`, relaying to istiod.

Thin I/O around `StreamSession`. Each Envoy stream (SotW or Delta) gets its own
upstream channel and stream, so that a new Envoy connection never inherits
another stream's pending messages and a restarted istiod is reached anew.
Messages travel as raw bytes in both directions (no serializer on either side).

A stream becomes Envoy's once its first request has been read and parses as a
(Delta)DiscoveryRequest: only then does it replace the previous stream (only
the newest is kept, and health reports go to it) and dial istiod. Upstream
replaces and dials as soon as a stream opens; waiting for one valid request
means that a client sending garbage, a truncated message or one over the size
limit costs neither Envoy its stream nor istiod a connection. A request over
`max_receive_message_size` (4 MiB, upstream's limit) is refused by gRPC from
its length prefix, before it is buffered (RESOURCE_EXHAUSTED).

Per stream, two tasks and the upstream call's request iterator:
- Envoy → queue: read a request, let the session add the agent's own requests;
- queue → istiod: grpc writes the queued requests upstream in order;
- istiod → Envoy: read one response, forward it and wait for the write to be
  accepted before reading the next (or hand a consumed type to its callback
  and queue the ACK). This keeps at most one response in the proxy, so memory
  stays bounded however large a push is; gRPC flow control pushes back on
  istiod. A response is held once: its bytes are dropped as soon as they are
  routed (what is still needed is the same bytes object to forward, or a consumed
  type's value alone), and nothing of a push stays once it is handled. The
  request queue is unbounded, as upstream's is: requests are small and a
  bounded queue could deadlock both directions under load.

ECDS with remote Wasm modules (when the hooks have an ECDS rewriter): a response the rewriter wants is not
written by the reader; its conversion starts at once (the modules are fetched while the reader goes on with
the next responses, so no other type waits for a download), and a task of its own writes the result to
Envoy, or queues the agent's NACK, after the previous ECDS conversion of the stream (ECDS keeps its order).
Writes to Envoy are then serialized by a lock; without the hook nothing changes on the path.

The first task to end decides how the Envoy stream ends: an upstream error
ends it with that status (Envoy reconnects with its own backoff), Envoy
closing ends the upstream stream, a newer stream replaces it.

Why grpcio and not grpclib (pure Python, on h2), measured by `benchmarks/bench_grpc_stacks.py`: grpclib's
import is ~7.5 MB less RSS, but that is file-backed (libgrpc's pages, shared by every agent of a node running
one image); anonymous memory, what each pod costs, differs by 0-3 MB. A grpclib relay spends 2-4 times
grpcio's time per hop on a 5,000-cluster push, and it has no receive limit applied from the length prefix
(a message is buffered whole, whatever it announces), no setting for concurrent streams (h2's 100), no
connect backoff: the hostile-stream protections above would rest on its private stream API.

Where a push's peak goes (bench_memory, /proc/PID/smaps sampled every 50 ms): during a 5,000-cluster push the
main malloc arena grows by ~10 MB and the second by ~4-5 MB, handed back by the trimmer a second later. Most of
it is grpcio's: its receive path gathers a message's slices into a bytearray and copies that into the bytes it
hands over (three copies at once, while the next message is already arriving), and a write copies the bytes
once more. The routing parse (`core/messages.py`) holds one copy only while it parses (upb keeps the unparsed resources
as unknown fields), before the write's copy exists, so it does not add to the peak. Turning off BDP probing on the
upstream channel (istiod pushing ahead into a grown window) moved nothing (VmHWM 80.5-80.8 MB against 81.1).

No task awaiting a gRPC read or write is ever cancelled. grpcio's aio layer
releases a batch (its operations and the message it received) only when the
awaiting coroutine takes the result (grpc/grpc#43360 describes the operation
arrays); a read whose task is cancelled while a message arrives leaves that
message allocated in C for good: measured, 1.8 MB of every 3 MB message, and
100 MB and more per round of `benchmarks/bench_xds_hostile_streams.py`. A
stream is ended by ending its calls instead (the upstream call cancelled, the
handler returning), which completes every pending batch; its tasks then finish
on their own, held by the proxy until they do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import grpc.aio

from istio_agent.protos import nds_pb2, typeurls
from istio_agent.security.ca_client import keepalive_options
from istio_agent.xds import upstream
from istio_agent.xds.core import messages, routing
from istio_agent.xds.core.session import Consume, Drop, Health, StreamSession, ToEnvoy, apply_node_hook
from istio_agent.xds.core.terminations import CANCELLED, termination_type
from istio_agent.xds.options import XdsProxyHooks, XdsProxyOptions

log = logging.getLogger(__name__)
T = TypeVar("T")


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
    max_request: int = 0  # the largest request read from Envoy, in bytes (upstream's pilot_xds_recv_max)


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
        # Tasks awaiting gRPC reads and writes of streams, held until they end (they are never cancelled).
        self._pending: set[asyncio.Task[Any]] = set()
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
        # Upstream serves Envoy with the same keepalive parameters it dials istiod with. No BDP probing:
        # Envoy's requests are small, and without it the receive window stays at 64 KB, so an oversized
        # message costs that much before its refusal instead of whatever the window had grown to (~400 KB).
        server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", self.options.max_receive_message_size),
            ("grpc.max_send_message_length", -1),
            ("grpc.max_concurrent_streams", self.options.max_concurrent_streams),
            ("grpc.http2.bdp_probe", 0),
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
        # Every call has ended with the server, so its pending reads and writes have completed or soon will.
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=self.options.stop_grace)
        for task in list(self._pending):
            task.cancel()
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

    @property
    def pending_io(self) -> int:
        """How many of the streams' tasks still await a gRPC read or write (none once every stream has ended)."""
        return len(self._pending)

    # --- gRPC handlers ------------------------------------------------------------------------------------
    async def _sotw(self, _requests: Any, context: grpc.aio.ServicerContext) -> None:
        await self._serve(context, delta=False)

    async def _delta(self, _requests: Any, context: grpc.aio.ServicerContext) -> None:
        await self._serve(context, delta=True)

    async def _serve(self, context: grpc.aio.ServicerContext, delta: bool) -> None:
        self._next_id += 1
        stream = _ProxiedStream(self, self._next_id, delta, context)
        self.stats.streams += 1
        mode = "delta" if delta else "sotw"
        self._event("connect", mode)
        try:
            await stream.run()
        finally:
            self._event("disconnect", mode)
            if self._current is stream:
                self._current = None

    def _register(self, stream: _ProxiedStream) -> None:
        """`stream` sent a valid first request: it is Envoy's stream now, and the previous one ends."""
        previous, self._current = self._current, stream
        if previous is not None:
            log.warning("XDS proxy: new Envoy stream %d replaces stream %d", stream.id, previous.id)
            previous.superseded.set()

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """A task that awaits gRPC operations: referenced until it ends, and never cancelled by a stream."""
        task = asyncio.create_task(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

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
        # Requests for istiod; None tells the writer to stop.
        self.outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.superseded = asyncio.Event()
        self.ended = False  # set once the stream's end is decided: no task starts another read or write
        self.forwarding = False  # the first requests are queued: later ones (and health reports) follow them
        self.ecds = proxy.hooks.ecds
        # Only with an ECDS rewriter do two tasks write to Envoy (the reader and the ECDS forwarder).
        self.write_lock: asyncio.Lock | None = asyncio.Lock() if self.ecds is not None else None
        self.ecds_tail: asyncio.Task[None] | None = None
        self.ecds_version = ""  # the last ECDS version Envoy ACKed (what upstream's NACK carries)

    def report_health(self, health: Health) -> None:
        if not self.forwarding:
            return  # queued after the first requests, from the proxy's latest report (run() catches up)
        for data in self.session.on_health(health):
            self.outbox.put_nowait(data)

    async def run(self) -> None:
        # The handler's task is cancelled by grpc when Envoy goes away: the read is awaited in a task of its own.
        try:
            first = await asyncio.shield(self.proxy._spawn(self._guarded(self._first_requests())))
        except asyncio.CancelledError:
            self._terminated("downstream_end", None)
            raise
        if isinstance(first, _End):
            self._terminated("downstream_end", first)
            self._finish(first)
            return
        self.proxy._register(self)
        settings = self.proxy.options.upstream
        try:
            channel = await upstream.dial(settings)
        except asyncio.CancelledError:
            self._terminated("downstream_end", None)
            raise
        except upstream.UpstreamError as exc:
            self.proxy.stats.upstream_failures += 1
            self.proxy._event("upstream_failure", "dial")
            log.warning("XDS proxy: failed to connect to upstream %s: %s", settings.address, exc)
            self._finish(_End(grpc.StatusCode.UNAVAILABLE, str(exc), "upstream"))
            return
        try:
            method = routing.DELTA_METHOD if self.delta else routing.SOTW_METHOD
            for data in first:
                self.outbox.put_nowait(data)
            del first
            self.forwarding = True
            # A report made while this stream read its first request or dialled went nowhere yet: send it now.
            latest = self.proxy._health
            if latest is not None and latest != self.session.health:
                self.report_health(latest)
            try:
                metadata = await upstream.call_metadata(settings)
            except upstream.UpstreamError as exc:
                log.warning("XDS proxy: stream %d: %s", self.id, exc)
                end = _End(grpc.StatusCode.UNAVAILABLE, str(exc), "upstream")
                self._terminated("upstream_end", end)
                self._terminated("downstream_end", None)
                self._finish(end)
                return
            call = channel.stream_stream(method, request_serializer=_identity, response_deserializer=_identity)(
                self._requests(), metadata=metadata
            )
            log.info("XDS proxy: stream %d (%s) connected to %s", self.id, "delta" if self.delta else "sotw",
                     settings.address)
            end = await self._relay(call)
        except asyncio.CancelledError:  # Envoy went away (grpc cancels the handler): istiod's side is ended too
            self._terminated("upstream_end", None)
            self._terminated("downstream_end", None)
            raise
        finally:
            await channel.close()
        if end.side == "upstream" and end.code != grpc.StatusCode.OK:
            self.proxy.stats.upstream_failures += 1
            self.proxy._event("upstream_failure", end.code.name)
            log.info("XDS proxy: stream %d ended by %s: %s %s", self.id, end.side, end.code.name, end.details)
        # Both sides end: the one that ended it as its status says, the other torn down by the proxy.
        self._terminated("upstream_end", end if end.side == "upstream" else None)
        self._terminated("downstream_end", end if end.side != "upstream" else None)
        self._finish(end)

    def _terminated(self, kind: str, end: _End | None) -> None:
        """Tell the metrics how one side ended (`upstream_end`, `downstream_end`): `cancelled` or `error`."""
        self.proxy._event(kind, CANCELLED if end is None else termination_type(end.code.name, end.details))

    def _finish(self, end: _End) -> None:
        if end.code != grpc.StatusCode.OK:
            self.context.set_code(end.code)
            self.context.set_details(end.details)

    async def _first_requests(self) -> list[bytes] | _End:
        """The stream's first request, with the node hook applied, and what goes upstream for it."""
        data = await self._read_downstream()
        if isinstance(data, _End):
            return data
        hook = self.proxy.hooks.node_hook
        try:
            if hook is not None:
                data = apply_node_hook(data, self.delta, hook)
            return self._accept(data)
        except messages.DecodeError as exc:
            return _End(grpc.StatusCode.INVALID_ARGUMENT, str(exc), "downstream")

    def _accept(self, data: bytes) -> list[bytes]:
        """A request from Envoy: what to send upstream for it. Raises DecodeError on garbage."""
        head = messages.request_head(data, self.delta)
        out = self.session.upstream_requests(head, data)
        if len(data) > self.proxy.stats.max_request:
            self.proxy.stats.max_request = len(data)
        if head.error is not None:  # Envoy's NACK, for the metrics hook
            self.proxy._event("envoy_nack", head.type_url)
        elif head.type_url == typeurls.EXTENSION_CONFIG and head.version_info:
            self.ecds_version = head.version_info
        self.proxy.stats.requests += 1
        return out

    async def _read_downstream(self) -> bytes | _End:
        try:
            data = await self.context.read()
        except Exception as exc:  # the RPC was torn down under us
            return _End(grpc.StatusCode.CANCELLED, f"downstream read failed: {exc}", "downstream")
        if data is grpc.aio.EOF:
            # Also how a request over the size limit shows here: gRPC has already failed the call.
            return _End(grpc.StatusCode.OK, "", "downstream")
        assert isinstance(data, bytes)
        return data

    async def _relay(self, call: Any) -> _End:
        spawn = self.proxy._spawn
        tasks = [  # priority order when several end at once
            spawn(self._guarded(self._from_upstream(call))),
            spawn(self._guarded(self._from_downstream())),
        ]
        superseded = asyncio.create_task(self.superseded.wait())
        try:
            await asyncio.wait([*tasks, superseded], return_when=asyncio.FIRST_COMPLETED)
        finally:
            # End the calls rather than the tasks: every pending read and write completes, and each task
            # returns at its next step. The downstream read ends when this handler returns.
            self.ended = True
            self.outbox.put_nowait(None)
            call.cancel()
            superseded.cancel()
        for task in tasks:
            if task.done():
                return task.result()
        return _End(grpc.StatusCode.OK, "replaced by a newer stream or stopped", "proxy")

    async def _guarded(self, coro: Coroutine[Any, Any, T]) -> T | _End:
        try:
            return await coro
        except Exception as exc:  # a bug, not a peer's doing: say so, end the stream
            log.error("XDS proxy: stream %d failed", self.id, exc_info=exc)
            return _End(grpc.StatusCode.INTERNAL, f"xds proxy error: {exc}", "proxy")

    async def _from_downstream(self) -> _End:
        """Envoy → outbox. Ends when Envoy half-closes, sends garbage, or goes away."""
        while True:
            data = await self._read_downstream()
            if isinstance(data, _End):
                return data
            if self.ended:
                return _End(grpc.StatusCode.OK, "", "proxy")
            try:
                for out in self._accept(data):
                    self.outbox.put_nowait(out)
            except messages.DecodeError as exc:
                return _End(grpc.StatusCode.INVALID_ARGUMENT, str(exc), "downstream")
            del data

    async def _requests(self) -> AsyncIterator[bytes]:
        """Outbox → istiod, in order, as the call's request iterator (grpc writes them; ends at None).

        Not a task of ours calling `call.write()`: a write awaits the call's initial metadata, and a call
        cancelled before that is sent never wakes it (the task would wait forever). grpc stops its own
        writer when the call is cancelled. Health reports wait for LDS (the session never emits them earlier).
        """
        while (data := await self.outbox.get()) is not None:
            yield data
            del data

    async def _from_upstream(self, call: Any) -> _End:
        """istiod → Envoy, one response at a time (the next read waits for the forward).

        Nothing of a response is kept once it is handled. Keeping the last one until the next read (as this
        did) held a whole push per stream for as long as Envoy stays connected, i.e. for good, and two pushes
        at once while the next large one (EDS after CDS) arrived; `bench_grpc_stacks.py` measures the RSS
        of a relay with a stream held open after its push. Dropping it costs about a millisecond per 0.9 MB
        push in the pure-transport `bench_xds_proxy_overhead.py` (freed memory is mapped again for the
        next push), against pushes that Envoy takes seconds to apply (`bench_xds.py`).
        """
        while True:
            try:
                data = await call.read()
            except grpc.aio.AioRpcError as exc:
                return _End(exc.code(), exc.details() or "", "upstream")
            except asyncio.CancelledError:
                # Cancelling the call cancels grpc's own set-up task, which a first read awaits.
                if not call.cancelled():
                    raise
                return _End(grpc.StatusCode.CANCELLED, "upstream call cancelled", "proxy")
            if data is grpc.aio.EOF:
                return _End(await call.code(), await call.details() or "", "upstream")
            if self.ended:
                return _End(grpc.StatusCode.OK, "", "proxy")
            self.proxy.stats.received += 1
            try:
                action = self.session.on_response(data)
            except messages.DecodeError as exc:
                return _End(grpc.StatusCode.INTERNAL, f"from upstream: {exc}", "upstream")
            del data  # the action holds what is still needed: the same bytes, or a consumed type's value
            if isinstance(action, ToEnvoy):
                if (self.ecds is not None and action.type_url == typeurls.EXTENSION_CONFIG
                        and self.ecds.needs_rewrite(action.data)):
                    self._convert_ecds(action.data)
                    del action
                    continue
                try:
                    if self.write_lock is None:
                        await self.context.write(action.data)
                    else:
                        async with self.write_lock:
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
            del action  # handled: nothing of this push stays while the next one is awaited

    def _convert_ecds(self, data: bytes) -> None:
        """Start converting an ECDS response now; forward it (or NACK it) after the stream's previous one."""
        assert self.ecds is not None
        conversion = asyncio.ensure_future(self.ecds.rewrite(data, self.delta, self.ecds_version))
        self.ecds_tail = self.proxy._spawn(self._forward_ecds(self.ecds_tail, conversion))

    async def _forward_ecds(self, previous: asyncio.Task[None] | None, conversion: asyncio.Future[tuple[bytes, bool]]
                            ) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        try:
            data, nack = await conversion
        except Exception:
            log.exception("XDS proxy: stream %d: ECDS conversion failed; the response is dropped", self.id)
            return
        if self.ended:
            return
        if nack:
            self.proxy.stats.nacked += 1
            self.proxy._event("agent_nack", typeurls.EXTENSION_CONFIG)
            self.outbox.put_nowait(data)
            return
        assert self.write_lock is not None
        try:
            async with self.write_lock:
                if self.ended:
                    return
                await self.context.write(data)
        except Exception as exc:
            log.info("XDS proxy: stream %d: ECDS write to Envoy failed: %s", self.id, exc)
            return
        self.proxy.stats.responses += 1
        self.proxy._event("push", typeurls.EXTENSION_CONFIG)
