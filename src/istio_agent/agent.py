"""The agent: composes the components that run beside one proxy.

Each component is a plain object with `async start()` / `async stop()`. The
agent starts them in dependency order (identity → DNS → XDS proxy → status
server → Envoy), waits for a stop request (SIGTERM/SIGINT, `/quitquitquit`, or
Envoy exiting on its own), drains Envoy as upstream does, and stops the rest in
reverse order. There is no global state: two agents can run in one process.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from istio_agent.config import env
from istio_agent.config.errors import ConfigError
from istio_agent.config.loader import AgentConfig, load_agent_config

if TYPE_CHECKING:
    from aiohttp import web

    from istio_agent.dns.proxy import DnsProxy
    from istio_agent.envoy.admin import EnvoyAdmin
    from istio_agent.envoy.process import EnvoyProcess
    from istio_agent.grpcxds.readiness import BootstrapProbe
    from istio_agent.protos import nds_pb2
    from istio_agent.security.identity import WorkloadIdentity
    from istio_agent.status.agent_metrics import AgentMetrics
    from istio_agent.status.probes import ProbeOptions
    from istio_agent.status.readiness import ReadinessState
    from istio_agent.xds.proxy import XdsProxy

log = logging.getLogger(__name__)

# How long start-up waits for the first workload certificate before loading the rest.
FIRST_CERTIFICATE_HEAD_START = 2.0
# Upstream's pilot-agent exits with -1 (255) when Envoy fails.
ENVOY_FAILED_EXIT_CODE = 255


class Component(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True)
class AgentFlags:
    """`pilot-agent proxy` command-line flags, as upstream names them."""

    proxy_type: str = "sidecar"
    domain: str = ""
    mesh_config: str = "./etc/istio/config/mesh"
    service_cluster: str = "istio-proxy"
    proxy_log_level: str = "warning,misc:error"
    proxy_component_log_level: str = ""
    concurrency: int = 0
    template_file: str = ""
    outlier_log_path: str = ""
    log_as_json: bool = False


class Agent:
    """One agent: builds its components from the config and runs them until told to stop."""

    def __init__(self, config: AgentConfig, flags: AgentFlags) -> None:
        self.config = config
        self.flags = flags
        self.components: list[Component] = []
        self._stopping = asyncio.Event()
        self.exit_code = 0
        self.disable_envoy = config.environment.get(env.DISABLE_ENVOY)
        self.dns_enabled = config.environment.get(env.ISTIO_META_DNS_CAPTURE) or config.environment.get(
            env.ISTIO_META_ENABLE_DNS_SERVER)
        self.identity: WorkloadIdentity | None = None
        self.dns: DnsProxy | None = None
        self.xds: XdsProxy | None = None
        self.readiness: ReadinessState | None = None
        self.envoy: EnvoyProcess | None = None
        self.admin: EnvoyAdmin | None = None
        self.grpc_bootstrap_probe: BootstrapProbe | None = None
        self.metrics: AgentMetrics | None = None  # istio_agent_* on this agent's own registry
        self._probes: ProbeOptions | None = None  # ISTIO_KUBE_APP_PROBERS, parsed once in build_identity
        self._background: set[asyncio.Task[None]] = set()
        self._name_table_lock = asyncio.Lock()

    # ---- construction ------------------------------------------------------------------------

    def build(self) -> None:
        """Build every component (tests use this; `run()` builds in two phases)."""
        self.build_identity()
        self.build_rest()

    def build_identity(self) -> None:
        """Validate the whole configuration, then build the workload identity (light imports only).

        The identity starts before the rest is even imported, so the CSR is in flight while
        the agent loads its heavier parts; configuration errors still surface before anything runs.
        """
        from prometheus_client import CollectorRegistry

        from istio_agent.security.ca_client import CaClient
        from istio_agent.security.identity import WorkloadIdentity
        from istio_agent.security.options import SecurityOptions
        from istio_agent.status.agent_metrics import AgentMetrics
        from istio_agent.status.metrics_merge import parse_scrape_annotations
        from istio_agent.status.probes import ProbeOptions
        from istio_agent.status.readiness import ReadinessState

        environment, pc = self.config.environment, self.config.proxy_config
        self._probes = ProbeOptions.from_config(self.config)  # a malformed ISTIO_KUBE_APP_PROBERS fails start here
        parse_scrape_annotations(environment.get(env.ISTIO_PROMETHEUS_ANNOTATIONS), pc.status_port)
        self.metrics = AgentMetrics(CollectorRegistry(auto_describe=True))
        security = SecurityOptions.from_config(self.config, run_sds_server=not self.disable_envoy)
        # The CA client the identity would make itself, wrapped to time CSRs and count their outcomes.
        self.identity = WorkloadIdentity(security, signer=self.metrics.metered_signer(CaClient(security)))
        self.metrics.watch_secrets(self.identity.cache)
        self.components.append(self.identity)
        self.readiness = ReadinessState(dns_enabled=bool(self.dns_enabled) and not self.disable_envoy)

    def build_rest(self) -> None:
        """DNS, XDS proxy, gRPC bootstrap and status server, in start order."""
        from istio_agent.memory import MemoryTrimmer

        self.components.append(MemoryTrimmer())
        if self.dns_enabled:
            self._build_dns()
        self._build_xds_proxy()
        self._build_grpc_bootstrap()
        if self.config.proxy_config.status_port > 0:
            self._build_status_server()

    def _build_dns(self) -> None:
        import os

        from istio_agent.dns.options import ALT_RESOLV_CONF, DnsProxyOptions, port53_rules
        from istio_agent.dns.proxy import DnsProxy

        environment = self.config.environment
        options = port53_rules(DnsProxyOptions(
            addr=environment.get(env.DNS_PROXY_ADDR),
            namespace=self.config.identity.namespace,
            domain=self.config.identity.domain,
            forward_parallel=environment.get(env.DNS_FORWARD_PARALLEL),
        ), os.geteuid(), Path(ALT_RESOLV_CONF).exists())
        self.dns = DnsProxy(options, registry=self.metrics.registry if self.metrics is not None else None)
        self.components.append(self.dns)

    def _on_name_table(self, table: nds_pb2.NameTable) -> None:
        """Compile the table off the event loop; readiness waits for the first one to be served."""
        if self.dns is None:
            if self.readiness is not None:
                self.readiness.name_table_received = True
            return
        task = asyncio.get_running_loop().create_task(self._swap_name_table(table))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _swap_name_table(self, table: nds_pb2.NameTable) -> None:
        assert self.dns is not None
        async with self._name_table_lock:  # tables are applied in the order they arrived
            try:
                await self.dns.update_name_table_async(table)
            except Exception:
                log.exception("compiling the NameTable failed; the previous table stays in service")
                return
        if self.readiness is not None:
            self.readiness.name_table_received = True

    def _on_trust_bundle(self, pems: list[str]) -> None:
        if self.identity is not None:
            self.identity.cache.set_extra_roots("pcds", pems)

    def _build_xds_proxy(self) -> None:
        from istio_agent.xds.options import XdsProxyOptions
        from istio_agent.xds.proxy import XdsProxy

        self.xds = XdsProxy(XdsProxyOptions.from_config(
            self.config, on_name_table=self._on_name_table, on_trust_bundle=self._on_trust_bundle,
            on_event=self.metrics.xds_event if self.metrics is not None else None))
        if self.metrics is not None:
            self.metrics.watch_xds(self.xds)
        self.components.append(self.xds)

    def _build_grpc_bootstrap(self) -> None:
        """GRPC_XDS_BOOTSTRAP for proxyless apps; upstream writes it whenever the path is set (default: always)."""
        from istio_agent.grpcxds import BootstrapProbe, BootstrapWriter, GrpcBootstrapOptions

        target = self.config.environment.get(env.GRPC_XDS_BOOTSTRAP)
        if not target or self.xds is None:
            return
        path = self.config.path(target)
        options = GrpcBootstrapOptions.from_config(self.config, self.xds.options.socket_path,
                                                   outlier_log_path=self.flags.outlier_log_path)
        self.components.append(BootstrapWriter(path, options))  # before the status server: ready implies written
        self.grpc_bootstrap_probe = BootstrapProbe(path, self.config.workdir)

    def _build_status_server(self) -> None:
        from istio_agent.status.metrics_handler import MetricsOptions, add_metrics_routes
        from istio_agent.status.probes_prober import add_probe_routes
        from istio_agent.status.secrets_debug import add_secrets_debug_route
        from istio_agent.status.server import StatusServer, StatusServerOptions

        assert self.readiness is not None and self.identity is not None and self.metrics is not None
        assert self._probes is not None
        pc = self.config.proxy_config
        probes = self._probes
        scraping = MetricsOptions.from_config(self.config)  # build_identity already refused bad annotations
        registry = self.metrics.registry
        cache = self.identity.cache
        server = StatusServer(
            StatusServerOptions(port=pc.status_port, admin_port=pc.proxy_admin_port, no_envoy=self.disable_envoy),
            self.readiness,
            on_quit=lambda: self.request_stop(0),
            on_drain=self.drain_now,
            extra_ready_check=self._proxyless_ready,
            extra_routes=[lambda app: add_probe_routes(app, probes), lambda app: add_secrets_debug_route(app, cache),
                          lambda app: add_metrics_routes(app, scraping, registry), self._add_ndsz_route],
        )
        self.components.append(server)

    def _add_ndsz_route(self, app: web.Application) -> None:
        """`/debug/ndsz`: the NameTable the DNS proxy serves, as JSON, localhost only."""
        from aiohttp import web

        from istio_agent.dns.ndsz import name_table_json
        from istio_agent.status.server import is_localhost

        async def ndsz(request: web.Request) -> web.Response:
            if not is_localhost(request.remote):
                return web.Response(status=403, text="only requests from localhost are allowed")
            status, body = name_table_json(self.dns.name_table() if self.dns is not None else None)
            return web.Response(status=status, text=body, content_type="application/json")

        app.router.add_get("/debug/ndsz", ndsz)

    def _proxyless_ready(self) -> str | None:
        """Upstream's gRPC probe (with or without Envoy): the bootstrap loads and its certificate files exist."""
        return self.grpc_bootstrap_probe.check() if self.grpc_bootstrap_probe is not None else None

    # ---- Envoy -------------------------------------------------------------------------------

    def _envoy_process(self) -> EnvoyProcess:
        from istio_agent.config.node import pilot_sans
        from istio_agent.envoy.admin import EnvoyAdmin
        from istio_agent.envoy.argv import EnvoyLaunch, envoy_command, read_bootstrap_override, split_component_log
        from istio_agent.envoy.bootstrap import write_bootstrap
        from istio_agent.envoy.bootstrap_options import bootstrap_options
        from istio_agent.envoy.process import EnvoyProcess
        from istio_agent.version import ISTIO_COMPAT_VERSION

        config, flags, environment = self.config, self.flags, self.config.environment
        pc = config.proxy_config
        opts = bootstrap_options(
            environment, pc, config.identity.id, list(config.identity.ips), config.labels, config.annotations,
            pilot_san=pilot_sans(pc.discovery_address, str(pc.get("controlPlaneAuthPolicy", ""))),
            outlier_log_path=flags.outlier_log_path,
            istio_version=environment.get(env.ISTIO_VERSION) or ISTIO_COMPAT_VERSION,
            log_as_json=flags.log_as_json,
        )
        written = write_bootstrap(opts, config.workdir, istio_bootstrap=environment.get(env.ISTIO_BOOTSTRAP),
                                  template_file=flags.template_file)
        level, components = split_component_log(flags.proxy_log_level)
        component_levels = ",".join(filter(None, [*components, flags.proxy_component_log_level]))
        override = environment.get(env.ISTIO_BOOTSTRAP_OVERRIDE)
        launch = EnvoyLaunch(
            config_file=str(written.path),
            drain_duration=pc.drain_duration,
            node_ips=tuple(config.identity.ips),
            log_level=level,
            component_log_level=component_levels,
            concurrency=pc.concurrency,
            config_override_json=read_bootstrap_override(override) if override else "",
        )
        self.admin = EnvoyAdmin(pc.proxy_admin_port)
        envoy_uid = environment.get(env.ISTIO_AGENT_ENVOY_UID)
        return EnvoyProcess(envoy_command(pc.binary_path, launch), on_exit=self._on_envoy_exit,
                            cwd=str(config.workdir), preexec_user=(envoy_uid, envoy_uid) if envoy_uid > 0 else None)

    def _on_envoy_exit(self, code: int) -> None:
        """Fate-sharing: Envoy is gone, so is the agent; a failed Envoy makes the agent exit 255 as upstream's."""
        self.envoy = None
        self.request_stop(ENVOY_FAILED_EXIT_CODE if code != 0 else 0)

    async def drain_now(self) -> None:
        """POST drain_listeners?graceful (inbound only for sidecars), as `/drain` and SIGTERM do."""
        if self.admin is None or self.envoy is None:
            return
        from istio_agent.envoy.admin import AdminError

        path = "/drain_listeners?graceful" + ("&inboundonly" if self.flags.proxy_type == "sidecar" else "")
        try:
            await self.admin.post(path)
        except AdminError as exc:
            log.warning("draining Envoy failed: %s", exc)

    async def _drain_and_stop_envoy(self) -> None:
        from istio_agent.envoy.admin import AdminError
        from istio_agent.envoy.drain import DrainPolicy, next_step
        from istio_agent.envoy.stats import ACTIVE_CONNECTIONS_FILTER, active_downstream_connections, parse_stats

        envoy, admin = self.envoy, self.admin
        if envoy is None or admin is None:
            return
        if self.readiness is not None:
            self.readiness.draining = True
        environment = self.config.environment
        policy = DrainPolicy(
            termination_drain_duration=self.config.proxy_config.termination_drain_duration,
            exit_on_zero_active_connections=environment.get(env.EXIT_ON_ZERO_ACTIVE_CONNECTIONS),
            minimum_drain_duration=environment.get(env.MINIMUM_DRAIN_DURATION),
        )
        log.info("draining Envoy (%s)", "until no active connections" if policy.exit_on_zero_active_connections
                 else f"for {policy.termination_drain_duration:g}s")
        await self.drain_now()
        loop = asyncio.get_running_loop()
        started = loop.time()
        active: int | str | None = "unpolled"
        while self.envoy is not None:
            step = next_step(policy, started, loop.time(), active)
            if step.stop:
                log.info("stopping Envoy: %s", step.reason)
                break
            if step.wait > 0:
                await asyncio.sleep(step.wait)
            if step.poll_connections and loop.time() - started >= policy.minimum_drain_duration:
                try:
                    active = active_downstream_connections(parse_stats(await admin.stats(ACTIVE_CONNECTIONS_FILTER)))
                except AdminError as exc:
                    log.warning("reading active connections failed: %s", exc)
                    active = None
        if self.envoy is not None:
            await self.envoy.stop()
            self.envoy = None

    # ---- running -----------------------------------------------------------------------------

    def request_stop(self, exit_code: int = 0) -> None:
        self.exit_code = self.exit_code or exit_code
        self._stopping.set()

    async def _first_certificate(self, timeout: float) -> None:
        """Give the first CSR a short head start before the heavier components load.

        Envoy cannot serve before it has a certificate anyway, and loading the rest blocks
        the event loop for a moment; a slow or absent CA only delays start-up by `timeout`.
        """
        if self.identity is None or not self.identity.cache.uses_ca:
            return
        try:
            await asyncio.wait_for(self.identity.wait_for_certificate(), timeout)
        except (TimeoutError, Exception) as exc:
            log.info("first certificate not there yet (%s); starting the other components", type(exc).__name__)

    async def run(self) -> int:
        self.build_identity()
        started: list[Component] = []
        try:
            for component in list(self.components):
                await component.start()
                started.append(component)
            await self._first_certificate(FIRST_CERTIFICATE_HEAD_START)
            first_rest = len(self.components)
            self.build_rest()
            for component in self.components[first_rest:]:
                await component.start()
                started.append(component)
            if not self.disable_envoy:
                self.envoy = self._envoy_process()
                await self.envoy.start()
            log.info("agent started: node %s", self.config.identity.id)
            await self._stopping.wait()
            log.info("agent stopping")
            await self._drain_and_stop_envoy()
        finally:
            for task in list(self._background):
                task.cancel()
            if self.envoy is not None:
                await self.envoy.stop()
            for component in reversed(started):
                try:
                    await component.stop()
                except Exception:
                    log.exception("stopping %s failed", type(component).__name__)
        return self.exit_code


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run(flags: AgentFlags, workdir: Path | None = None) -> int:
    """Entry point of `pilot-agent proxy`: returns the process exit code."""
    import signal

    try:
        config = load_agent_config(
            env.Environment(),
            workdir or Path.cwd(),
            proxy_type=flags.proxy_type,
            domain=flags.domain or None,
            mesh_config_path=flags.mesh_config,
            concurrency=flags.concurrency,
            service_cluster=flags.service_cluster,
        )
    except ConfigError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    from istio_agent.memory import limit_malloc_arenas

    limit_malloc_arenas()
    loop = _new_event_loop()
    asyncio.set_event_loop(loop)
    agent = Agent(config, flags)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.request_stop)
    try:
        return loop.run_until_complete(agent.run())
    except (ConfigError, OSError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    finally:
        loop.close()
