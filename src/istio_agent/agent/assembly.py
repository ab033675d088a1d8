"""Builds one agent from its resolved options: which components run, in which order, wired to which.

Two stages, so that the first certificate is on its way before the heavier parts
are even imported:

1. identity (CA client, secret cache, SDS server) and the agent's metrics
   registry, then a bounded wait for the first certificate;
2. the heap trimmer, the DNS proxy (when on) with its NameTable feed, the Wasm
   module cache (unless ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION is off), the XDS
   proxy, the workload health checker (when ProxyConfig has a readinessProbe),
   the gRPC bootstrap (when written), the status server (when it has a port)
   and Envoy (unless DISABLE_ENVOY), in that order.

The wiring: the XDS proxy has the Wasm cache rewrite ECDS (remote modules to local
files), hands NameTables to the DNS proxy (compiled off the
event loop, in arrival order; readiness waits for the first) and PCDS trust
bundles to the secret cache; the status server reads readiness, the one Envoy
admin client, the cache (`/debug/secrets`), the DNS proxy (`/debug/ndsz`) and the
metrics registry; `/quitquitquit` asks the agent to stop and `/drain` drains
Envoy's listeners. The health checker asks Envoy's readiness through the same
admin client and reports its state changes through the XDS proxy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from istio_agent.agent.options import AgentOptions
from istio_agent.lifecycle import Component, Lifecycle

if TYPE_CHECKING:
    from istio_agent.dns.proxy import DnsProxy
    from istio_agent.envoy.admin import EnvoyAdmin
    from istio_agent.envoy.supervisor import EnvoySupervisor
    from istio_agent.grpcxds.readiness import BootstrapProbe
    from istio_agent.httpio.routing import Router
    from istio_agent.protos import nds_pb2
    from istio_agent.security.identity import WorkloadIdentity
    from istio_agent.security.key_ahead import KeyAhead
    from istio_agent.status.agent_metrics import AgentMetrics
    from istio_agent.status.readiness import ReadinessState
    from istio_agent.xds.proxy import XdsProxy

log = logging.getLogger(__name__)

Agent = Lifecycle  # the agent is its components on the lifecycle


class NameTableFeed:
    """Compiles each NameTable from the XDS proxy into the DNS proxy, in order, off the event loop."""

    name = "name-table-feed"

    def __init__(self, dns: DnsProxy, readiness: ReadinessState) -> None:
        self.dns = dns
        self.readiness = readiness
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    def on_name_table(self, table: nds_pb2.NameTable) -> None:
        task = asyncio.get_running_loop().create_task(self._swap(table))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _swap(self, table: nds_pb2.NameTable) -> None:
        async with self._lock:  # tables are applied in the order they arrived
            try:
                await self.dns.update_name_table_async(table)
            except Exception:
                log.exception("compiling the NameTable failed; the previous table stays in service")
                return
        self.readiness.name_table_received = True

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()


class AgentAssembly:
    """The composition root of one agent; `agent` is ready to run."""

    def __init__(self, options: AgentOptions, first_key: KeyAhead | None = None) -> None:
        self.options = options
        self.first_key = first_key
        # `agent:debug` scope: the RSS budget. Once started, start-up's objects leave the collector's walks.
        self.agent = Agent(self._identity_stage, self._rest_stage, logger=log, on_started=self._started)
        self.metrics: AgentMetrics | None = None
        self.identity: WorkloadIdentity | None = None

    def _identity_stage(self) -> list[Component]:
        from istio_agent.metrics import CollectorRegistry
        from istio_agent.metrics.instruments import set_created_series
        from istio_agent.security.ca_client import CaClient
        from istio_agent.security.identity import FirstCertificateWait, WorkloadIdentity
        from istio_agent.status.agent_metrics import AgentMetrics

        security, status = self.options.security, self.options.status
        set_created_series(status.metrics.created_series if status is not None else True)
        self.metrics = AgentMetrics(CollectorRegistry(auto_describe=True))
        # The CA client the identity would make itself, wrapped to time CSRs and count their outcomes.
        self.identity = WorkloadIdentity(
            security, signer=self.metrics.metered_signer(CaClient(security, on_retry=self.metrics.ca_retry)),
            first_key=self.first_key, on_sds_event=self.metrics.sds_event)
        self.metrics.watch_secrets(self.identity.cache)
        return [self.identity, FirstCertificateWait(self.identity, self.options.first_certificate_head_start)]

    @staticmethod
    def _started() -> None:
        from istio_agent.memory import freeze_start_up_objects

        freeze_start_up_objects()

    def _rest_stage(self) -> list[Component]:
        from istio_agent.memory import MemoryTrimmer
        from istio_agent.status.readiness import ReadinessState
        from istio_agent.xds.options import XdsProxyHooks
        from istio_agent.xds.proxy import XdsProxy

        options, metrics, identity = self.options, self.metrics, self.identity
        assert metrics is not None and identity is not None, "the identity stage runs first"
        status = options.status
        readiness = ReadinessState(dns_enabled=status.dns_enabled if status else False,
                                   envoy_enabled=options.envoy is not None, on_first_ready=metrics.envoy_ready)
        trimmer = MemoryTrimmer()
        components: list[Component] = [trimmer]

        dns: DnsProxy | None = None
        feed: NameTableFeed | None = None
        if options.dns is not None:
            from istio_agent.dns.proxy import DnsProxy

            dns = DnsProxy(options.dns, registry=metrics.registry)
            feed = NameTableFeed(dns, readiness)
            components += [dns, feed]

        cache = identity.cache
        ecds = None
        if options.wasm is not None:
            from istio_agent.wasm.cache import WasmModuleCache
            from istio_agent.wasm.ecds import EcdsRewriter
            from istio_agent.wasm.metrics import WasmMetrics

            wasm_cache = WasmModuleCache(options.wasm, WasmMetrics(metrics.registry))
            components.append(wasm_cache)
            ecds = EcdsRewriter(wasm_cache)

        def xds_event(kind: str, detail: str) -> None:
            metrics.xds_event(kind, detail)
            # What a closed stream held, or what relaying a push took (a 5,000-cluster push: ~10 MB), is free
            # now: give it back a second after the burst, not at the next 15 s tick (bench_memory's curve).
            if kind in ("disconnect", "push"):
                trimmer.soon()

        xds = XdsProxy(options.xds, XdsProxyHooks(
            on_name_table=feed.on_name_table if feed is not None else None,
            on_trust_bundle=lambda pems: cache.set_extra_roots("pcds", pems),
            on_event=xds_event,
            ecds=ecds,
        ))
        metrics.watch_xds(xds)
        components.append(xds)

        admin: EnvoyAdmin | None = None
        if options.envoy is not None:
            from istio_agent.envoy.admin import EnvoyAdmin

            admin = EnvoyAdmin(options.envoy.admin_port)
        if options.health is not None:
            components.append(self._health_checker(xds, admin))

        probe: BootstrapProbe | None = None
        if options.grpc_bootstrap is not None:
            from istio_agent.grpcxds.readiness import BootstrapProbe
            from istio_agent.grpcxds.writer import BootstrapWriter

            target = options.grpc_bootstrap
            components.append(BootstrapWriter(target.path, target.content))  # before the status server
            probe = BootstrapProbe(target.path, options.workdir)

        envoy: EnvoySupervisor | None = None
        if options.envoy is not None and admin is not None:
            from istio_agent.envoy.supervisor import EnvoySupervisor

            envoy = EnvoySupervisor(options.envoy, admin)

        if status is not None:
            components.append(self._status_server(readiness, admin, probe, dns, envoy))
        if envoy is not None:
            components.append(envoy)
        return components

    def _health_checker(self, xds: XdsProxy, admin: EnvoyAdmin | None) -> Component:
        """ProxyConfig's readinessProbe, after Envoy's readiness when there is an Envoy (upstream's aggregate)."""
        from istio_agent.health.probers import EnvoyReadyProbe, NetworkProbe, Probe, app_probe
        from istio_agent.health.runner import WorkloadHealthChecker

        options = self.options.health
        assert options is not None
        app = app_probe(options)
        probes: list[Probe] = [EnvoyReadyProbe(admin)] if admin is not None else []
        return WorkloadHealthChecker(options, [*probes, app], xds.set_health,
                                     on_close=[app.close] if isinstance(app, NetworkProbe) else [])

    def _status_server(self, readiness: ReadinessState, admin: EnvoyAdmin | None, probe: BootstrapProbe | None,
                       dns: DnsProxy | None, envoy: EnvoySupervisor | None) -> Component:
        from istio_agent.status.merged_metrics.handler import add_metrics_routes
        from istio_agent.status.ndsz import add_ndsz_route
        from istio_agent.status.probes.prober import add_probe_routes
        from istio_agent.status.secrets_debug import add_secrets_debug_route
        from istio_agent.status.server import StatusServer

        options, metrics, identity = self.options, self.metrics, self.identity
        assert options.status is not None and metrics is not None and identity is not None
        status, registry, cache = options.status, metrics.registry, identity.cache
        name_table = dns.name_table if dns is not None else (lambda: None)

        async def drain_listeners() -> None:
            if envoy is not None:
                await envoy.drain_listeners()

        routes: list[Callable[[Router], None]] = [
            lambda app: add_probe_routes(app, status.probes), lambda app: add_secrets_debug_route(app, cache),
            lambda app: add_metrics_routes(app, status.metrics, registry), lambda app: add_ndsz_route(app, name_table)]
        if status.profiling:
            from istio_agent.status.profiling import add_profiling_routes

            routes.append(add_profiling_routes)
        return StatusServer(
            status, readiness, admin=admin, bootstrap_probe=probe,
            on_quit=lambda: self.agent.request_stop(0), on_drain=drain_listeners, routes=routes,
            on_malformed=metrics.status_malformed_requests.inc,
        )


def assemble(options: AgentOptions, first_key: KeyAhead | None = None) -> Agent:
    """The agent for these options, its components built stage by stage as it starts.

    `first_key` is the workload key the CLI started making before the agent's imports (`key_ahead.py`).
    """
    return AgentAssembly(options, first_key).agent
