"""install-cni's composition root: which components the node agent has, in which order, run on the one lifecycle.

Start order (stop is the reverse): the plugin's log socket, the istio-cni fast path, the health server
(with `--readiness-port`), the metrics server (with `--monitoring-port`), the installation (installer and
watcher), the installer loop, then, built once those have started, the repair controller
(`--repair-enabled`). The installer loop shares the program's fate: its failure exits 1, as upstream.
SIGTERM or SIGINT: every started component stops in reverse, so the loop ends and reports not ready, the
installation is cleaned up (our entry, kubeconfig and executable), then the servers and sockets close; the
exit status is 0. A component install-cni cannot run without failing to start (`StartFailed`) exits 1
after the ones already started are stopped.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from istio_agent.cni.install.components import (
    FastPathServer,
    HealthServer,
    Installation,
    InstallerLoop,
    MetricsServer,
    PluginLogSocket,
    RepairSupervisor,
    StartFailed,
)
from istio_agent.cni.install.metrics import InstallMetrics, without_created_series
from istio_agent.cni.install.options import InstallOptions
from istio_agent.cni.install.servers import Readiness
from istio_agent.kube.access import KubeAccess
from istio_agent.lifecycle import START_FAILED_EXIT_CODE, Component, Lifecycle

log = logging.getLogger("istio_agent.cni.install")

PROGRAM = "CNI node agent"


class InstallCniAssembly:
    """The components of one install-cni, built from its options; `lifecycle` runs them."""

    def __init__(self, options: InstallOptions, access: KubeAccess, source: Path) -> None:
        self.options, self.access, self.source = options, access, source
        self.readiness = Readiness()
        self.metrics = InstallMetrics()
        self.lifecycle = Lifecycle(self.node_stage(), self.repair_stage, name=PROGRAM, logger=log)

    def node_stage(self) -> list[Component]:
        options = self.options
        parts: list[Component] = [PluginLogSocket(options.log_uds_socket), FastPathServer(options.cni_agent_run_dir)]
        if options.readiness_port:
            parts.append(HealthServer(options.readiness_port, self.readiness))
        if options.monitoring_port > 0:
            parts.append(MetricsServer(options.monitoring_port, self.metrics.registry))
        installation = Installation(options, self.source, self.access)
        parts += [installation, InstallerLoop(installation, self.readiness, self.metrics)]
        return parts

    def repair_stage(self) -> list[Component]:
        """Built once the installer runs, as upstream starts its repair controller beside it."""
        if not self.options.repair.enabled:
            log.info("CNI repair controller is disabled")
            return []
        return [RepairSupervisor(self.options, self.access, self.metrics.registry)]


async def run_until_stopped(lifecycle: Lifecycle) -> int:
    """Run until SIGTERM/SIGINT or the end of a fate-sharing component; the exit status."""
    try:
        return await lifecycle.run_until_signalled()
    except StartFailed:  # logged where it failed; what had started is stopped
        return START_FAILED_EXIT_CODE


def log_configuration(options: InstallOptions, source: Path) -> None:
    log.info("CNI install configuration: %s", ", ".join(
        f"{k}={v!r}" for k, v in vars(options).items() if k != "repair"))
    log.info("CNI race repair configuration: %s", options.repair)
    log.info("CNI plugin executable: %s", source)
    if options.cni_network_config or options.cni_network_config_file:
        log.warning("--cni-network-config/--cni-network-config-file are ignored: the istio-cni entry is built "
                    "from the settings, as upstream's installer does")
    if options.ambient_enabled:
        log.warning("ambient is enabled, but this install-cni provides no ambient node agent: only the entry "
                    "(ambient_enabled, enablement selectors) and the Istio-owned file layout follow it")


def run_install_cni(options: InstallOptions, access: KubeAccess, source: Path) -> int:
    """The node agent of this process until SIGTERM/SIGINT; the exit status."""
    log_configuration(options, source)
    without_created_series()  # before any metric is made

    async def main() -> int:
        return await run_until_stopped(InstallCniAssembly(options, access, source).lifecycle)

    return asyncio.run(main())
