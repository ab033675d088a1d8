"""`install-cni`: the Istio CNI node agent's command line and process (the edge: flags in, tasks wired).

Upstream's flags (each also read from its variable, see `options.py`) and
Istio's logging flags; `main()` resolves them into `InstallOptions`, then runs:
the log socket, the istio-cni fast path (`fastpath.py`, not upstream), the health
server, the metrics server, the installer loop (install, watch, reinstall) and,
with `--repair-enabled`, the repair controller beside it, restarted with backoff
if it fails (install does not go down with it).
SIGTERM or SIGINT: not ready, stop the loop and repair, clean up (our entry,
kubeconfig and executable), stop the servers, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from istio_agent.cni.install import binaries
from istio_agent.cni.install.options import (
    BOOL,
    FLAGS,
    KUBERNETES_ENV,
    InstallOptions,
    OptionsError,
    env_name,
    resolve_install_options,
)
from istio_agent.kube.access import KubeAccess, KubeAccessError, in_cluster

log = logging.getLogger("istio_agent.cni.install")

# Istio scope -> our loggers (upstream's repair logs under cni-agent too).
SCOPES = {"default": ("istio_agent",), "cni-agent": ("istio_agent.cni.install", "istio_agent.cni.repair"),
          "cni-plugin": ("istio_agent.cni.plugin",)}
_SCOPE_OF = {"istio_agent.cni.install": "cni-agent", "istio_agent.cni.repair": "cni-agent",
             "istio_agent.cni.plugin": "cni-plugin"}
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "warning": logging.WARNING,
           "error": logging.ERROR, "fatal": logging.CRITICAL, "none": logging.CRITICAL + 10}
_LEVEL_NAMES = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn", logging.ERROR: "error",
                logging.CRITICAL: "fatal"}
REPAIR_BACKOFF_MAX = 30.0


class _IstioFormatter(logging.Formatter):
    """Istio's line: RFC 3339 UTC time, level, scope, message (tab-separated), or one JSON object."""

    def __init__(self, as_json: bool) -> None:
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        stamp += f".{int((record.created % 1) * 1e6):06d}Z"
        level = _LEVEL_NAMES.get(record.levelno, record.levelname.lower())
        scope = _SCOPE_OF.get(record.name, record.name)
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        if self.as_json:
            import json
            return json.dumps({"time": stamp, "level": level, "scope": scope, "msg": message})
        return f"{stamp}\t{level}\t{scope}\t{message}"


def configure_logging(output_level: str, as_json: bool) -> None:
    """`--log_output_level` (`scope:level,...`; `all` sets every scope) onto our loggers; lines to stdout."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_IstioFormatter(as_json))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("istio_agent").setLevel(logging.INFO)
    for part in filter(None, (p.strip() for p in output_level.split(","))):
        scope, sep, level_name = part.rpartition(":")
        if not sep:
            scope, level_name = "default", part
        if level_name.lower() not in _LEVELS:
            raise click.BadParameter(f"invalid level {level_name!r} in {part!r}", param_hint="--log_output_level")
        level = _LEVELS[level_name.lower()]
        names = [n for group in SCOPES.values() for n in group] if scope == "all" else SCOPES.get(scope, ())
        for name in names:
            logging.getLogger(name).setLevel(level)
    # Upstream filters the plugin's lines at the agent's level (its UDS logger takes cni-agent's).
    logging.getLogger("istio_agent.cni.plugin").setLevel(logging.getLogger("istio_agent.cni.install")
                                                          .getEffectiveLevel())


def _flag_options(function: Callable[..., Any]) -> Callable[..., Any]:
    for name, kind, default, help_text in reversed(FLAGS):
        extra: dict[str, Any] = {"is_flag": False, "flag_value": "true"} if kind == BOOL else {}
        function = click.option(f"--{name}", name.replace("-", "_"), default=None, envvar=env_name(name),
                                metavar="BOOL" if kind == BOOL else ("INT" if kind == "int" else "TEXT"),
                                help=f"{help_text} [env {env_name(name)}; default {default!r}]", **extra)(function)
    for variable in reversed(KUBERNETES_ENV):  # environment only, as upstream; hidden flags are how click reads it
        function = click.option(f"--{variable.lower().replace('_', '-')}", variable.lower(), default="",
                                envvar=variable, hidden=True)(function)
    return function


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.option("--log_output_level", default="default:info",
              help="Comma-separated scope:level pairs (scopes: default, cni-agent, cni-plugin, all).")
@click.option("--log_as_json", is_flag=True, default=False, help="Log lines as JSON objects.")
@_flag_options
def command(log_output_level: str, log_as_json: bool, **raw: str | None) -> None:
    """Install and configure the Istio CNI plugin on a node, keep it installed, repair pods broken by the race."""
    configure_logging(log_output_level, log_as_json)
    values = {name: raw[name.replace("-", "_")] for name, *_ in FLAGS if raw.get(name.replace("-", "_")) is not None}
    env = {variable: raw.get(variable.lower()) or "" for variable in KUBERNETES_ENV}
    try:
        options = resolve_install_options({k: str(v) for k, v in values.items()}, env, socket.gethostname(),
                                          log_output_level)
    except OptionsError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        access = in_cluster(env, options.service_account_dir, options.kube_ca_file, options.skip_tls_verify)
    except KubeAccessError as exc:
        raise click.ClickException(f"{exc} (install-cni writes the plugin's kubeconfig for that API server)") from None
    if options.repair.enabled:
        try:
            from istio_agent.cni.repair.rules import check_options
        except ImportError:
            pass
        else:
            try:
                check_options(options.repair)
            except ValueError as exc:
                raise click.ClickException(str(exc)) from None
    try:
        source = binaries.find_plugin_source()
    except binaries.BinaryError as exc:
        raise click.ClickException(str(exc)) from None
    if (Path(options.cni_bin_dir) / binaries.PLUGIN_NAME).resolve() == source.resolve():
        raise click.ClickException(f"--cni-bin-dir {options.cni_bin_dir!r} holds the plugin install-cni copies "
                                   f"({source}): cleanup would delete it; give the node's CNI bin dir")
    sys.exit(asyncio.run(run(options, access, source)))


def _log_configuration(options: InstallOptions, source: Path) -> None:
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


class _CurrentRegistry:
    """A collector on install-cni's registry showing the metrics of the repair controller's current run.

    Each run gets a registry of its own (a restarted controller registers its counters again, which
    one shared registry would refuse as duplicates); its counters start again from zero, which
    Prometheus reads as a counter reset.
    """

    def __init__(self) -> None:
        self.current: Any = None

    def collect(self) -> Any:
        return iter(()) if self.current is None else self.current.collect()

    def describe(self) -> Any:
        return iter(())


async def supervise_repair(options: InstallOptions, access: KubeAccess, registry: Any) -> None:
    """Run the repair controller beside the installer; a failure is logged and retried with backoff.

    A settings error (ValueError, naming the flag) is not retried: repair stays off, install runs on.
    """
    try:
        from istio_agent.cni.repair.controller import run_repair
    except ImportError as exc:
        log.warning("the CNI repair controller is unavailable (%s): pods are not repaired", exc)
        return
    from prometheus_client import CollectorRegistry

    view = _CurrentRegistry()
    registry.register(view)
    backoff = 1.0
    while True:
        started = time.monotonic()
        view.current = CollectorRegistry(auto_describe=True)
        try:
            await run_repair(options.repair, access, view.current)
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
        backoff = min(backoff * 2, REPAIR_BACKOFF_MAX)


async def run(options: InstallOptions, access: KubeAccess, source: Path) -> int:
    """The node agent until SIGTERM/SIGINT; the exit status."""
    from istio_agent.cni.install.installer import (
        RESULT_SUCCESS,
        Installer,
        InstallError,
        StepOutcome,
        keep_installed,
        watched_directories,
    )
    from istio_agent.cni.install.metrics import InstallMetrics
    from istio_agent.cni.install.servers import Readiness, Servers, health_handler, log_handler, metrics_handler
    from istio_agent.cni.install.watcher import DirectoryWatcher

    _log_configuration(options, source)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    metrics = InstallMetrics()
    readiness = Readiness()
    servers = Servers()
    try:
        await servers.start_unix(options.log_uds_socket, log_handler())
    except OSError as exc:
        log.error("failed to start the UDS log server on %s: %s", options.log_uds_socket, exc)
        return 1
    log.info("serving plugin logs on %s", options.log_uds_socket)
    from istio_agent.cni.install.fastpath import FastPath

    fast_path: FastPath | None = None
    candidate = FastPath(options.cni_agent_run_dir)
    try:
        await candidate.start()
        fast_path = candidate
        log.info("serving the istio-cni fast path on %s (root callers only)", candidate.path)
    except OSError as exc:  # the launcher then runs the plugin in-process
        log.error("failed to start the istio-cni fast path on %s: %s; the plugin runs in-process",
                  candidate.path, exc)
    if options.readiness_port:
        try:
            port = await servers.start_tcp(options.readiness_port, health_handler(readiness))
        except OSError as exc:
            log.error("failed to start the health server on port %d: %s", options.readiness_port, exc)
            if fast_path is not None:
                await fast_path.stop()
            await servers.stop()
            return 1
        log.info("serving /healthz and /readyz on port %d", port)
    if options.monitoring_port > 0:
        try:
            port = await servers.start_tcp(options.monitoring_port, metrics_handler(metrics.registry))
            log.info("serving /metrics on port %d", port)
        except OSError as exc:  # upstream logs this and runs on
            log.error("unable to listen on monitoring port %d: %s", options.monitoring_port, exc)

    try:
        installer = Installer(options, source, access)
    except ValueError as exc:
        log.error("%s", exc)
        if fast_path is not None:
            await fast_path.stop()
        await servers.stop()
        return 1
    watcher = DirectoryWatcher(watched_directories(options, access))
    watcher.start()
    installed_once = False

    def on_state(outcome: StepOutcome) -> None:
        nonlocal installed_once
        if outcome.ready and (not readiness.ready or outcome.changed):
            # Installed, or put back after a change took something away (upstream counts each such cycle).
            metrics.installs.labels(RESULT_SUCCESS).inc()
            log.info("Istio CNI configuration and binaries %s (%s)",
                     "reinstalled" if installed_once else "installed",
                     ", ".join(outcome.changed) or "nothing to change")
            installed_once = True
        elif readiness.ready and not outcome.ready:
            log.warning("the Istio CNI installation is no longer in effect")
        readiness.ready = outcome.ready
        metrics.ready.set(1 if outcome.ready else 0)

    def on_failure(exc: InstallError) -> None:
        metrics.installs.labels(exc.result).inc()
        log.error("installation failed: %s", exc)

    tasks = [asyncio.create_task(keep_installed(installer, watcher, on_state, on_failure), name="install")]
    if options.repair.enabled:
        tasks.append(asyncio.create_task(supervise_repair(options, access, metrics.registry), name="repair"))
    else:
        log.info("CNI repair controller is disabled")
    stopping = asyncio.create_task(stop.wait())
    status = 0
    try:
        done, _ = await asyncio.wait([stopping, tasks[0]], return_when=asyncio.FIRST_COMPLETED)
        if tasks[0] in done and tasks[0].exception() is not None:
            log.error("installer failed: %s", tasks[0].exception())
            status = 1
        log.info("CNI node agent shutting down")
    finally:
        readiness.ready = False
        metrics.ready.set(0)
        for task in [*tasks, stopping]:
            task.cancel()
        for task in [*tasks, stopping]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if fast_path is not None:
            await fast_path.stop()
        installer.cleanup()
        watcher.close()
        await servers.stop()
    return status


def main() -> None:
    command(prog_name="install-cni")
