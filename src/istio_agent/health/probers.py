"""The workload health checker's probes (I/O edge): the app's probe, and Envoy's readiness before it.

HTTP GET, TCP connect and gRPC health checks are the status server's app
prober (`status.probes.prober.AppProber`), set up as upstream's health probes
are: a fresh connection per probe (no keep-alive), HTTPS as HTTP/1.1 without
certificate verification, a probe without a `host` sent to the proxy's
address, HTTP probes from 127.0.0.6 (::6) so that capture rules let them
through. An HTTP answer from 200 to 399 is healthy. Exec probes run the command
(no shell) as the agent's user, killed at the timeout; exit status 0 is
healthy. Nothing here blocks the event loop: sockets are asyncio's and
grpc.aio's, the command is an asyncio subprocess.

Envoy's readiness is upstream's `ready.Probe` as its XDS proxy builds one for
the health checker: when the agent runs Envoy, every health probe first asks
whether Envoy has its configuration (CDS and LDS) and is LIVE with workers
started, the rules `/healthz/ready` applies (`status.readiness`), without the
DNS proxy's NameTable and without draining (upstream gives this probe neither).
Once Envoy has been ready it is not asked again. While it is not ready the
probe fails with that reason and the app is not probed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import subprocess
from collections.abc import Awaitable, Callable

from istio_agent.envoy.admin import AdminError, EnvoyAdmin
from istio_agent.envoy.stats import READY_STATS_FILTER, UPDATE_STATS_FILTER, parse_stats
from istio_agent.health.options import ExecAction, HealthAction, HealthCheckOptions
from istio_agent.status.probes.prober import AppProber
from istio_agent.status.probes.rules import AppProbe, HttpGetAction, ProbeOptions, probe_url
from istio_agent.status.readiness import ReadinessState

log = logging.getLogger("istio_agent.healthcheck")

# (healthy, why not): what every probe answers.
Outcome = tuple[bool, str]
Probe = Callable[[], Awaitable[Outcome]]
PROBE_NAME = "readinessProbe"  # the AppProbe's path: named in the prober's log lines


class ExecProbe:
    """Runs the command with the probe's timeout; the process is killed when the time is up (or on cancel)."""

    def __init__(self, action: ExecAction, timeout: float) -> None:
        self.action, self.timeout = action, timeout

    async def __call__(self) -> Outcome:
        command = self.action.command
        executable = shutil.which(command[0]) if "/" not in command[0] else command[0]
        if executable is None:
            return False, f"command {command[0]!r} could not be run: not found in PATH"
        try:
            # An absolute executable and close_fds=False (the agent's own descriptors are close-on-exec) let
            # subprocess use posix_spawn: no fork of a process full of gRPC threads, whose fork handlers would
            # log about being skipped at every probe.
            process = await asyncio.create_subprocess_exec(
                executable, *command[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, close_fds=False)
        except OSError as exc:
            return False, f"command {command[0]!r} could not be run: {exc.strerror or exc}"
        try:
            async with asyncio.timeout(self.timeout):
                code = await process.wait()
        except TimeoutError:
            return False, f"command {command[0]!r} did not finish within {self.timeout:g}s: killed"
        finally:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await asyncio.shield(process.wait())
        if code == 0:
            return True, ""
        if code < 0:
            return False, f"command {command[0]!r} was killed by signal {-code}"
        return False, f"command {command[0]!r} exited with status {code}"


class NetworkProbe:
    """HTTP GET, TCP connect or gRPC health check through the status server's app prober."""

    def __init__(self, options: HealthCheckOptions) -> None:
        action = options.action
        assert not isinstance(action, ExecAction)
        self.probe = AppProbe(path=PROBE_NAME, action=action, timeout=options.timeout)
        self.default_host = options.default_host
        # Upstream binds 127.0.0.6 (::6) for HTTP health probes only; TCP and gRPC dial from the default address.
        self.prober = AppProber(ProbeOptions(
            pod_ip=options.default_host, bind_probe_source=isinstance(action, HttpGetAction),
            keepalive=False, http2=False))

    async def __call__(self) -> Outcome:
        result = await self.prober.probe(self.probe)
        if 200 <= result.status < 400:
            return True, ""
        if result.reason:
            return False, result.reason
        action = self.probe.action
        where = probe_url(action, self.default_host) if isinstance(action, HttpGetAction) else "the app"
        return False, f"HTTP probe of {where} answered {result.status}, not 200-399"

    async def close(self) -> None:
        await self.prober.close()


class EnvoyReadyProbe:
    """Envoy's readiness as the health checker sees it: configured and LIVE once, then never asked again."""

    def __init__(self, admin: EnvoyAdmin) -> None:
        self.admin = admin
        self.state = ReadinessState(dns_enabled=False, envoy_enabled=True)

    async def __call__(self) -> Outcome:
        update_stats = ready_stats = None
        if self.state.needs_envoy_stats():
            try:
                update_stats = parse_stats(await self.admin.stats(UPDATE_STATS_FILTER))
                ready_stats = parse_stats(await self.admin.stats(READY_STATS_FILTER))
            except (AdminError, OSError) as exc:
                return False, f"Envoy's readiness stats could not be read: {exc}"
        reason = self.state.evaluate(update_stats, ready_stats)
        return (True, "") if reason is None else (False, reason)


def app_probe(options: HealthCheckOptions) -> ExecProbe | NetworkProbe:
    action: HealthAction = options.action
    if isinstance(action, ExecAction):
        return ExecProbe(action, options.timeout)
    return NetworkProbe(options)
