"""The ADS server: `envoy.service.discovery.v3.AggregatedDiscoveryService` over grpc.aio.

A thin adapter around the sans-IO sessions: each stream reads its requests
into a queue, registry changes drop a push marker into every stream's queue,
and one loop per stream feeds both to its `SotwSession`/`DeltaSession` and
writes what comes back. The mesh is one immutable `MeshSnapshot`, replaced
whole when the registry changes or a pod's proxy tells us its address.

A VM's proxy (`AUTO_REGISTER_GROUP` or `WORKLOAD_ENTRY` in its metadata) is
handed to `AutoRegistration` when its stream opens (a refusal ends the stream
with the reason), its HealthInformation requests set the entry's health, and
its last stream's end starts the grace period, after which a timer on the loop
removes the entry. Those changes are debounced as istiod debounces pushes
(`PILOT_DEBOUNCE_AFTER`, 100 ms): a burst of registrations costs one rebuild
of the mesh and one push to every stream per 100 ms, not one each (200
VMs registering at once otherwise starved each other: every registration
rebuilt the mesh and pushed to every connected VM). A registering VM is
answered at once from the mesh as it stands, and pushed its entry with the
next rebuild.

    ads = AdsServer(registry)
    plane.add_service(ads.register)      # same grpc.aio server as the CA
    ...
    ads.update_registry(new_registry)    # pushes to every connected proxy
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

from istio_agent.protos import typeurls
from istiod_local.controlplane.monitoring import XdsMonitor
from istiod_local.controlplane.tokens import TokenIdentity
from istiod_local.controlplane.xds.auth import AuthError, XdsAuthenticator
from istiod_local.controlplane.xds.autoregistration import AutoRegistration, RegistrationRefused, VmProxy
from istiod_local.controlplane.xds.generators import GeneratorSet, ProxyContext, Resources, default_generators
from istiod_local.controlplane.xds.mesh import (
    ConnectedPod,
    MeshSnapshot,
    build_snapshot,
    effective_workloads,
    service_views,
)
from istiod_local.controlplane.xds.proxy import Proxy, ProxyError, proxy_from_node
from istiod_local.controlplane.xds.registry import Registry
from istiod_local.controlplane.xds.sessions import DeltaSession, SotwSession

log = logging.getLogger("istiod_local.controlplane.ads")

_PUSH = object()
_EOF = object()
DEBOUNCE = 0.1  # seconds: istiod's PILOT_DEBOUNCE_AFTER default


@dataclass
class Connection:
    """One ADS stream: its proxy, its session, and the queue its loop reads."""

    id: str
    proxy: Proxy
    delta: bool
    session: SotwSession | DeltaSession
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    push_pending: bool = False
    pushes: int = 0

    def notify(self) -> None:
        if not self.push_pending:
            self.push_pending = True
            self.queue.put_nowait(_PUSH)

    def status(self) -> dict[str, Any]:
        """What the connection has been sent and what it refused (for debugging and tests)."""
        watches = {t: {"nonce": w.nonce, "nacked": w.nacked} for t, w in self.session.watches.items()}
        return {"id": self.id, "proxy": self.proxy.id, "delta": self.delta, "pushes": self.pushes,
                "watches": watches}


class AdsServer:
    """Serves ADS (SotW and Delta) for every connected proxy from the current registry."""

    def __init__(self, registry: Registry, generators: GeneratorSet | None = None,
                 authenticator: XdsAuthenticator | None = None, clock: Callable[[], float] = time.time,
                 workload_entries: AutoRegistration | None = None, monitor: XdsMonitor | None = None) -> None:
        # What the monitoring port shows (controlplane/monitoring.py): streams, pushes, ACKs and NACKs.
        self.monitor = monitor or XdsMonitor()
        self._generators = generators or default_generators()
        self._authenticator = authenticator
        self._clock = clock
        self._registry = registry
        self._pods: dict[tuple[str, str], ConnectedPod] = {}
        self._pod_streams: dict[tuple[str, str], int] = {}
        self.workload_entries = workload_entries or AutoRegistration()
        self._expiry: asyncio.TimerHandle | None = None
        self._pending: asyncio.TimerHandle | None = None  # a debounced rebuild
        self._snapshot = build_snapshot(1, registry)
        self._probe(self._snapshot)
        self._connections: dict[str, Connection] = {}
        self._ids = itertools.count(1)

    # ---- mesh state -------------------------------------------------------------------------------------------

    @property
    def snapshot(self) -> MeshSnapshot:
        return self._snapshot

    @property
    def registry(self) -> Registry:
        return self._registry

    def update_registry(self, registry: Registry) -> int:
        """Serve a new registry; every connected proxy gets what changed. Returns the snapshot version.

        The new mesh is generated once for a probe proxy first: if that fails, the error propagates
        and the registry in service stays (a bad registry must never cut proxies off). It also warms
        the shared per-snapshot caches before the push fans out.
        """
        entries = self.workload_entries
        trial = MeshSnapshot(self._snapshot.version + 1, registry,
                             effective_workloads(registry, self._pods, entries.entries(registry)),
                             service_views(registry))
        self._probe(trial)
        self._registry = registry
        entries.update_registry(registry, self._clock())
        self._rebuild(trial)
        return self._snapshot.version

    def _probe(self, snapshot: MeshSnapshot) -> None:
        namespace = snapshot.workloads[0].namespace if snapshot.workloads else "default"
        probe = proxy_from_node(base_pb2.Node(id=f"sidecar~0.0.0.0~istiod-probe.{namespace}~{namespace}.svc."
                                                 f"{snapshot.registry.domain_suffix}"))
        ctx = ProxyContext.build(snapshot, probe)
        for name in self._generators.names():
            generator = self._generators.get(name)
            for type_url in sorted(generator.types):
                generator.generate(type_url, ctx, None)

    def _changed(self) -> None:
        """WorkloadEntries changed: rebuild the mesh and push within DEBOUNCE, once for all changes until then."""
        if self._pending is None:
            self._pending = asyncio.get_running_loop().call_later(DEBOUNCE, self._debounced)

    def _debounced(self) -> None:
        self._pending = None
        self._rebuild()

    def _rebuild(self, prepared: MeshSnapshot | None = None) -> None:
        if self._pending is not None:  # this rebuild includes what was waiting
            self._pending.cancel()
            self._pending = None
        workloads = effective_workloads(self._registry, self._pods, self.workload_entries.entries(self._registry))
        current = self._snapshot
        same_registry = current.registry is self._registry
        if same_registry and current.workloads == workloads:
            return
        if prepared is not None and prepared.registry is self._registry and prepared.workloads == workloads:
            self._snapshot = prepared
        else:
            services = current.services if same_registry else service_views(self._registry)
            self._snapshot = MeshSnapshot(current.version + 1, self._registry, workloads, services)
        log.info("mesh version %d: %d services, %d workloads; pushing to %d streams", self._snapshot.version,
                 len(self._snapshot.services), len(workloads), len(self._connections))
        for connection in self._connections.values():
            connection.notify()

    def _pod_connected(self, proxy: Proxy) -> None:
        key = proxy.key
        self._pod_streams[key] = self._pod_streams.get(key, 0) + 1
        self._pods[key] = ConnectedPod.from_proxy(proxy)
        self._rebuild()

    def _pod_disconnected(self, proxy: Proxy) -> None:
        key = proxy.key
        left = self._pod_streams.get(key, 1) - 1
        if left > 0:
            self._pod_streams[key] = left
            return
        self._pod_streams.pop(key, None)
        self._pods.pop(key, None)
        self._rebuild()

    # ---- WorkloadEntries -----------------------------------------------------------------------------------------

    def _vm_connect(self, conn_id: str, vm: VmProxy, identity: TokenIdentity | None) -> None:
        """Auto-register or take control of the proxy's WorkloadEntry; RegistrationRefused ends the stream."""
        if self.workload_entries.connect(conn_id, vm, identity, self._registry, self._clock()):
            self._changed()

    def _vm_disconnect(self, conn_id: str) -> None:
        self.workload_entries.disconnect(conn_id, self._clock())
        self._changed()
        self._schedule_expiry()

    def _on_health(self, connection: Connection, request: Any) -> None:
        """HealthInformation on the stream: the error detail (or its absence) becomes the entry's condition."""
        healthy = not request.HasField("error_detail")
        message = "" if healthy else request.error_detail.message
        if self.workload_entries.report_health(connection.id, healthy, message, self._clock()):
            self._changed()

    def _schedule_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        deadline = self.workload_entries.next_deadline()
        if deadline is None:
            return
        loop = asyncio.get_running_loop()
        self._expiry = loop.call_later(max(0.0, deadline - self._clock()), self._expire)

    def _expire(self) -> None:
        self._expiry = None
        if self.workload_entries.expire(self._clock()):
            self._changed()
        self._schedule_expiry()

    def workload_entry_status(self) -> list[dict[str, Any]]:
        """The WorkloadEntries as their objects would show (annotations, Healthy condition)."""
        return self.workload_entries.status(self._registry)

    def connections(self) -> list[dict[str, Any]]:
        return [c.status() for c in self._connections.values()]

    # ---- gRPC ---------------------------------------------------------------------------------------------------

    def register(self, server: grpc.aio.Server) -> None:
        """A `ServiceRegistrar`: add the ADS service to a grpc.aio server (e.g. `ControlPlane.add_service`)."""
        ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(_Servicer(self), server)

    def _generate_for(self, proxy: Proxy) -> tuple[Callable[[str, Collection[str] | None], Resources], frozenset[str]]:
        generator = self._generators.for_proxy(proxy)
        cache: dict[int, ProxyContext] = {}

        def generate(type_url: str, names: Collection[str] | None) -> Resources:
            snapshot = self._snapshot
            ctx = cache.get(snapshot.version)
            if ctx is None:
                cache.clear()
                ctx = cache[snapshot.version] = ProxyContext.build(snapshot, proxy)
            return generator.generate(type_url, ctx, names)

        return generate, generator.types

    async def serve_stream(self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext, delta: bool) -> None:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        reader = asyncio.create_task(_read_into(requests, queue))
        connection: Connection | None = None
        vm_connected = False
        conn_id = ""
        try:
            first = await queue.get()
            while not (first is _EOF or isinstance(first, BaseException)) and first.type_url == typeurls.HEALTH_INFO:
                log.warning("ADS: health report before the first xDS request; ignored")  # as upstream
                first = await queue.get()
            if first is _EOF or isinstance(first, BaseException):
                return
            try:
                proxy = proxy_from_node(first.node)
            except ProxyError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                return
            identity: TokenIdentity | None = None
            if self._authenticator is not None:
                try:
                    identity = self._authenticator.authenticate(proxy, context, self._clock())
                except AuthError as exc:
                    log.warning("ADS: refused %s: %s", proxy.id, exc)
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
                    return
            generate, served = self._generate_for(proxy)
            conn_id = f"{proxy.id}-{next(self._ids)}"
            vm = VmProxy.from_proxy(proxy, _locality(first.node))
            is_vm = vm.is_vm(self.workload_entries.options)
            if is_vm:
                try:
                    self._vm_connect(conn_id, vm, identity)
                except RegistrationRefused as exc:
                    log.error("ADS: %s: %s", proxy.id, exc)
                    await context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
                    return
                vm_connected = True
            session: SotwSession | DeltaSession = (DeltaSession if delta else SotwSession)(proxy.id, served, generate)
            connection = Connection(conn_id, proxy, delta, session, queue)
            self._connections[conn_id] = connection
            self.monitor.connected(conn_id, proxy.id, proxy.type, _peer(context),
                                   str(proxy.metadata.get("ISTIO_VERSION") or ""), self._clock())
            log.info("ADS: new %s connection %s (generator %s)", "delta" if delta else "sotw", conn_id,
                     self._generators.for_proxy(proxy).name)
            if not is_vm:
                self._pod_connected(proxy)
            item = first
            while True:
                if item is _EOF:
                    return
                if isinstance(item, BaseException):
                    raise item
                if item is not _PUSH and item.type_url == typeurls.HEALTH_INFO:
                    self._on_health(connection, item)
                    item = await queue.get()
                    continue
                if item is _PUSH:
                    connection.push_pending = False
                    responses: list[Any] = connection.session.on_push(str(self._snapshot.version))
                    connection.pushes += bool(responses)
                else:
                    self.monitor.request(conn_id, item.type_url, item.response_nonce,
                                         item.error_detail.message if item.HasField("error_detail") else None,
                                         item.resource_names_subscribe if delta else item.resource_names, delta)
                    responses = connection.session.on_request(item, str(self._snapshot.version))  # type: ignore[arg-type]
                for response in responses:
                    await context.write(response)
                    self.monitor.sent(conn_id, response.type_url, response.nonce, self._clock(), item is _PUSH)
                item = await queue.get()
        finally:
            reader.cancel()
            if connection is not None:
                self._connections.pop(connection.id, None)
                self.monitor.disconnected(connection.id)
                if vm_connected:
                    self._vm_disconnect(connection.id)
                else:
                    self._pod_disconnected(connection.proxy)
                log.info("ADS: connection %s closed", connection.id)
            elif vm_connected:
                self._vm_disconnect(conn_id)


def _peer(context: grpc.aio.ServicerContext) -> str:
    """The client's address as upstream shows it (`10.244.0.5:41234`), without gRPC's `ipv4:` prefix."""
    peer = context.peer() or ""
    for prefix in ("ipv4:", "ipv6:", "unix:"):
        if peer.startswith(prefix):
            return peer[len(prefix):]
    return peer


def _locality(node: base_pb2.Node) -> str:
    """The node's bootstrap locality as upstream writes it on an entry (region/zone/subzone)."""
    if not node.HasField("locality"):
        return ""
    parts = [node.locality.region, node.locality.zone, node.locality.sub_zone]
    return "/".join(parts).rstrip("/")


async def _read_into(requests: AsyncIterator[Any], queue: asyncio.Queue[Any]) -> None:
    try:
        async for request in requests:
            queue.put_nowait(request)
        queue.put_nowait(_EOF)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the client went away mid-stream
        log.debug("ADS: stream read ended: %s", exc)
        queue.put_nowait(_EOF)


class _Servicer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    def __init__(self, server: AdsServer) -> None:
        self._server = server

    async def StreamAggregatedResources(  # type: ignore[override]
        self, request_iterator: AsyncIterator[discovery_pb2.DiscoveryRequest], context: grpc.aio.ServicerContext
    ) -> None:
        await self._server.serve_stream(request_iterator, context, delta=False)

    async def DeltaAggregatedResources(  # type: ignore[override]
        self, request_iterator: AsyncIterator[discovery_pb2.DeltaDiscoveryRequest], context: grpc.aio.ServicerContext
    ) -> None:
        await self._server.serve_stream(request_iterator, context, delta=True)
