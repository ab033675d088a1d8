"""`istiod-local serve`'s composition root: its servers as components on the product's one lifecycle.

Start order (stop is the reverse):

1. `ControlPlane`: the gRPC server on the plaintext and TLS ports, the CA and, with a registry, ADS on both;
2. `Monitoring` (with an address): istiod's monitoring port (`/metrics`, `/debug/connections`,
   `/debug/syncz`) for the ADS server; an address it cannot listen on is logged and skipped, not fatal;
3. `KubeApiServer` (with an address): the Kubernetes API slice, pods and namespaces from the registry;
4. the registry watcher (`XdsService`): reloads the registry file and pushes it to ADS and the API.

It runs until SIGTERM or SIGINT, then stops each started component in reverse (the watcher first, so no
reload lands on a stopped server; the gRPC ports last). A component failing to start stops the ones started
before it and raises (the command line reports it and exits 1). There is no fate-sharing component: nothing
ends `serve` but a signal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from istio_agent.lifecycle import Component, Lifecycle
from istiod_local.controlplane.monitoring import MonitoringServer, XdsMonitor
from istiod_local.controlplane.server import ControlPlane, ControlPlaneOptions
from istiod_local.controlplane.xds.autoregistration import WorkloadEntryOptions
from istiod_local.controlplane.xds.service import XdsOptions, XdsService

if TYPE_CHECKING:
    from istiod_local.controlplane.kubeapi.server import KubeApiOptions

log = logging.getLogger("istiod_local.controlplane")

PROGRAM = "istiod-local"


@dataclass(frozen=True)
class ServeOptions:
    """What `istiod-local serve`'s flags resolve to. An empty `monitoring_addr`, or no `kube`, turns that off."""

    control_plane: ControlPlaneOptions
    registry: str | None = None
    kube: KubeApiOptions | None = None
    workload_entries: WorkloadEntryOptions = field(default_factory=WorkloadEntryOptions)
    monitoring_addr: str = ""


class Monitoring:
    """istiod's monitoring port for one ADS server (or none: empty counters); a failed start only logs."""

    name = "monitoring"

    def __init__(self, address: str, monitor: XdsMonitor, mesh: Callable[[], tuple[int, int]] | None) -> None:
        self.server = MonitoringServer(address, monitor, mesh)
        self.serving = False

    @property
    def address(self) -> str:
        return self.server.bound if self.serving else ""

    async def start(self) -> None:
        try:
            await self.server.start()
        except (OSError, ValueError) as exc:
            log.error("monitoring: cannot listen on %s (--monitoring-addr; off disables it): %s; serving "
                      "without it", self.server.address, exc)
            return
        self.serving = True

    async def stop(self) -> None:
        if self.serving:
            self.serving = False
            await self.server.stop()


class RegistryWatcher:
    """The registry file's watcher, as a component (the ADS server itself is served by `ControlPlane`)."""

    name = "registry watcher"

    def __init__(self, xds: XdsService) -> None:
        self.xds = xds

    async def start(self) -> None:
        await self.xds.start()

    async def stop(self) -> None:
        await self.xds.stop()


class ServeAssembly:
    """The components of one `istiod-local serve`, wired to each other; `lifecycle` runs them.

    Building it loads the state directory (the CA, created on first use) and the registry, so a broken
    one stops `serve` before anything listens.
    """

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        self.plane = ControlPlane(options.control_plane)
        trust_domain = options.control_plane.trust_domain
        self.xds: XdsService | None = None
        if options.registry:
            self.xds = XdsService(XdsOptions(options.registry, trust_domain,
                                             workload_entries=options.workload_entries), self.plane.verifier)
            self.plane.add_service(self.xds.register)
        self.monitoring: Monitoring | None = None
        if options.monitoring_addr:
            ads = self.xds.ads if self.xds is not None else None
            self.monitoring = Monitoring(
                options.monitoring_addr, ads.monitor if ads is not None else XdsMonitor(),
                (lambda: (ads.snapshot.version, len(ads.snapshot.services))) if ads is not None else None)
        self.api = None
        if options.kube is not None:
            from istiod_local.controlplane.kubeapi.server import KubeApiServer
            from istiod_local.controlplane.xds.registry import Registry

            self.api = KubeApiServer(options.kube, self.plane.state)
            self.api.update_registry(self.xds.registry if self.xds is not None
                                     else Registry(trust_domain=trust_domain))
            if self.xds is not None:
                self.xds.add_listener(self.api.update_registry)
        self.lifecycle = Lifecycle(self.components(), name=PROGRAM, logger=log)

    def components(self) -> list[Component]:
        parts: list[Component] = [self.plane]
        if self.monitoring is not None:
            parts.append(self.monitoring)
        if self.api is not None:
            parts.append(self.api)
        if self.xds is not None:
            parts.append(RegistryWatcher(self.xds))
        return parts


async def run_until_signal(lifecycle: Lifecycle) -> int:
    """Run until SIGTERM or SIGINT (logged as istiod-local always has); the exit status."""
    return await lifecycle.run_until_signalled(on_signal=lambda: log.info("signal received, shutting down"))


async def run_serve(options: ServeOptions) -> int:
    """`istiod-local serve` until SIGTERM or SIGINT; its exit status (a failed start raises)."""
    return await run_until_signal(ServeAssembly(options).lifecycle)
