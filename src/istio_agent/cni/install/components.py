"""install-cni's components on the one lifecycle (`istio_agent.lifecycle`): each starts, stops, and says what
its failing to start means, as upstream's install-cni does.

- `PluginLogSocket` (`--log-uds-socket`), `HealthServer` (`--readiness-port`): a failed start is fatal
  (`StartFailed`: the error logged, install-cni exits 1);
- `FastPathServer` (`sidecar-add.sock`, not upstream) and `MetricsServer` (`--monitoring-port`): a failed
  start is logged and the program runs on without them (the launcher runs the plugin in-process; upstream
  logs its monitoring port's error and goes on);
- `Installation`: the installer and its directory watcher; its stop is the cleanup (our entry, the
  kubeconfig and the binary), written once, run on SIGTERM and after a failure alike;
- `InstallerLoop`: install, watch, reinstall; it shares the program's fate (its failure exits 1);
- `RepairSupervisor` (`--repair-enabled`): the repair controller beside the installer, restarted with backoff
  when it fails; install does not go down with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

from istio_agent.cni.install.cniconfig import split_exclude_namespaces
from istio_agent.cni.install.fastpath import FastPath
from istio_agent.cni.install.installer import (
    RESULT_SUCCESS,
    Installer,
    InstallError,
    StepOutcome,
    keep_installed,
    watched_directories,
)
from istio_agent.cni.install.metrics import CurrentRepairRun, InstallMetrics
from istio_agent.cni.install.options import InstallOptions
from istio_agent.cni.install.servers import Readiness, Servers, health_handler, log_handler, metrics_handler
from istio_agent.cni.install.watcher import DirectoryWatcher
from istio_agent.kube.access import KubeAccess
from istio_agent.metrics import CollectorRegistry

log = logging.getLogger("istio_agent.cni.install")

REPAIR_BACKOFF_MAX = 30.0


class StartFailed(Exception):
    """A component install-cni cannot run without failed to start (already logged): exit 1."""


class PluginLogSocket:
    """The plugin's log lines, POSTed to `log.sock`; install-cni cannot run without it."""

    name = "plugin log socket"

    def __init__(self, path: str) -> None:
        self.path = path
        self._servers = Servers()

    async def start(self) -> None:
        try:
            await self._servers.start_unix(self.path, log_handler())
        except OSError as exc:
            log.error("failed to start the UDS log server on %s: %s", self.path, exc)
            raise StartFailed(f"log socket {self.path}: {exc}") from exc
        log.info("serving plugin logs on %s", self.path)

    async def stop(self) -> None:
        await self._servers.stop()  # the socket file removed


class FastPathServer:
    """The istio-cni launcher's fast path; without it (a failed start) the launcher runs the plugin in-process."""

    name = "istio-cni fast path"

    def __init__(self, run_dir: str) -> None:
        self.fast_path = FastPath(run_dir)
        self.serving = False

    async def start(self) -> None:
        try:
            await self.fast_path.start()
        except OSError as exc:
            log.error("failed to start the istio-cni fast path on %s: %s; the plugin runs in-process",
                      self.fast_path.path, exc)
            return
        self.serving = True
        log.info("serving the istio-cni fast path on %s (root callers only)", self.fast_path.path)

    async def stop(self) -> None:
        if self.serving:
            self.serving = False
            await self.fast_path.stop()


class HealthServer:
    """`/healthz` and `/readyz` on `--readiness-port`; install-cni cannot run without it."""

    name = "health server"

    def __init__(self, port: int, readiness: Readiness) -> None:
        self.port = port
        self.readiness = readiness
        self._servers = Servers()

    async def start(self) -> None:
        try:
            port = await self._servers.start_tcp(self.port, health_handler(self.readiness))
        except OSError as exc:
            log.error("failed to start the health server on port %d: %s", self.port, exc)
            raise StartFailed(f"health server port {self.port}: {exc}") from exc
        log.info("serving /healthz and /readyz on port %d", port)

    async def stop(self) -> None:
        await self._servers.stop()


class MetricsServer:
    """`/metrics` on `--monitoring-port`; a port it cannot listen on is logged and the program runs on."""

    name = "metrics server"

    def __init__(self, port: int, registry: CollectorRegistry) -> None:
        self.port = port
        self.registry = registry
        self._servers = Servers()

    async def start(self) -> None:
        try:
            port = await self._servers.start_tcp(self.port, metrics_handler(self.registry))
        except OSError as exc:  # upstream logs this and runs on
            log.error("unable to listen on monitoring port %d: %s", self.port, exc)
            return
        log.info("serving /metrics on port %d", port)

    async def stop(self) -> None:
        await self._servers.stop()


class Installation:
    """The installer and the watcher of the directories it writes to; stopping it is the cleanup."""

    name = "installation"

    def __init__(self, options: InstallOptions, source: Path, access: KubeAccess) -> None:
        self.options, self.source, self.access = options, source, access
        self.installer: Installer | None = None
        self.watcher: DirectoryWatcher | None = None

    async def start(self) -> None:
        try:
            self.installer = Installer(self.options, self.source, self.access)
        except ValueError as exc:
            log.error("%s", exc)
            raise StartFailed(str(exc)) from exc
        self.watcher = DirectoryWatcher(watched_directories(self.options, self.access))
        self.watcher.start()

    async def stop(self) -> None:
        """Our CNI config (entry or file), the kubeconfig and the executable removed; the watches closed."""
        if self.installer is not None:
            self.installer.cleanup()
        if self.watcher is not None:
            self.watcher.close()


class InstallerLoop:
    """Install, then reinstall on every relevant change; it ends only by failing, which ends install-cni (1)."""

    name = "installer loop"

    def __init__(self, installation: Installation, readiness: Readiness, metrics: InstallMetrics) -> None:
        self.installation = installation
        self.readiness = readiness
        self.metrics = metrics
        self.installed_once = False
        self._task: asyncio.Task[None] | None = None

    def on_state(self, outcome: StepOutcome) -> None:
        if outcome.ready and (not self.readiness.ready or outcome.changed):
            # Installed, or put back after a change took something away (upstream counts each such cycle).
            self.metrics.installs.labels(RESULT_SUCCESS).inc()
            log.info("Istio CNI configuration and binaries %s (%s)",
                     "reinstalled" if self.installed_once else "installed",
                     ", ".join(outcome.changed) or "nothing to change")
            self.installed_once = True
        elif self.readiness.ready and not outcome.ready:
            log.warning("the Istio CNI installation is no longer in effect")
        self.readiness.ready = outcome.ready
        self.metrics.ready.set(1 if outcome.ready else 0)

    def on_failure(self, exc: InstallError) -> None:
        self.metrics.installs.labels(exc.result).inc()
        log.error("installation failed: %s", exc)

    async def start(self) -> None:
        installer, watcher = self.installation.installer, self.installation.watcher
        if installer is None or watcher is None:
            raise RuntimeError("the installer loop starts after the installation")
        self.readiness.check = installer.in_effect  # /readyz looks at the files as they are at each request
        self._task = asyncio.create_task(keep_installed(installer, watcher, self.on_state, self.on_failure),
                                         name="install")

    async def wait_exit(self) -> int:
        assert self._task is not None
        await asyncio.wait([self._task])  # not `await task`: cancelling this wait must not cancel the loop
        if self._task.cancelled():
            return 0
        failure = self._task.exception()
        if failure is not None:
            log.error("installer failed: %s", failure)
            return 1
        return 0

    async def stop(self) -> None:
        log.info("CNI node agent shutting down")
        self.readiness.ready = False
        self.metrics.ready.set(0)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


class RepairSupervisor:
    """The repair controller beside the installer: a failure is logged and retried with backoff.

    A settings error (ValueError, naming the flag) is not retried: repair stays off, install runs on.
    Each run counts on a registry of its own, shown on install-cni's through `CurrentRepairRun`.
    """

    name = "repair controller"

    def __init__(self, options: InstallOptions, access: KubeAccess, registry: CollectorRegistry,
                 backoff_max: float = REPAIR_BACKOFF_MAX) -> None:
        self.options, self.access, self.registry = options, access, registry
        self.backoff_max = backoff_max
        self.view = CurrentRepairRun()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.registry.register(self.view)
        self._task = asyncio.create_task(self.supervise(), name="repair")

    async def supervise(self) -> None:
        try:
            from istio_agent.cni.repair.controller import run_repair
        except ImportError as exc:
            log.warning("the CNI repair controller is unavailable (%s): pods are not repaired", exc)
            return
        backoff = 1.0
        while True:
            started = time.monotonic()
            self.view.current = CollectorRegistry(auto_describe=True)
            try:
                await run_repair(self.options.repair, self.access, self.view.current,
                                 native_nftables=self.options.native_nftables,
                                 exclude_namespaces=self.excluded_namespaces())
                return  # returned by itself: disabled
            except asyncio.CancelledError:
                raise
            except ValueError as exc:
                log.error("the CNI repair controller cannot run: %s; pods are not repaired", exc)
                return
            except Exception:
                log.exception("the CNI repair controller failed; restarting it in %.0f s", backoff)
            if time.monotonic() - started > 60:
                backoff = 1.0
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.backoff_max)

    def excluded_namespaces(self) -> list[str]:
        """`--exclude-namespaces` as the plugin reads it: in-place repair leaves those pods alone, as the plugin."""
        return split_exclude_namespaces(self.options.exclude_namespaces) or []

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self.registry.unregister(self.view)
