"""The workload health checker as an agent component: probes on the clock, state changes to istiod.

Upstream's agent runs this whenever the effective ProxyConfig has a
`readinessProbe` (a VM's `mesh.yaml` carries its WorkloadGroup's probe there),
whatever the proxy type. It reports through the XDS proxy: a change to
healthy is an empty HealthInformation request, a change to unhealthy one with
the failing probe's message as its error detail; the XDS proxy sends it after
Envoy's LDS request and again on every new stream.

Each probe is the aggregate upstream builds: Envoy's readiness first (when
the agent runs Envoy), then the app's probe, the first failure deciding. The
decisions are `health.checker`'s; time is the injected `Clock`. A probe that
has not answered `timeout` (plus a short grace for the probe's own timeout to
report itself) after it started is a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from istio_agent.clock import Clock, SystemClock
from istio_agent.health.checker import HealthChange, HealthThresholds, next_probe_at
from istio_agent.health.options import HealthCheckOptions
from istio_agent.health.probers import Outcome, Probe

log = logging.getLogger("istio_agent.healthcheck")

TIMEOUT_GRACE = 0.5  # the probes enforce the timeout themselves; this only catches one that does not
Report = Callable[[bool, str], None]


class WorkloadHealthChecker:
    """Runs `probes` (in order; the first failure decides) on the schedule of `options`, reporting changes."""

    name = "health-checker"

    def __init__(self, options: HealthCheckOptions, probes: Sequence[Probe], report: Report,
                 clock: Clock | None = None, on_close: Sequence[Callable[[], object]] = ()) -> None:
        self.options = options
        self.probes = list(probes)
        self.report = report
        self.clock = clock or SystemClock()
        self.thresholds = HealthThresholds(options.success_threshold, options.failure_threshold)
        self.probes_run = 0
        self._on_close = list(on_close)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is None:
            log.info("starting health check (%s) in %gs", type(self.options.action).__name__,
                     self.options.initial_delay)
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for close in self._on_close:
            result = close()
            if asyncio.iscoroutine(result):
                await result

    async def probe_once(self) -> Outcome:
        """One aggregate probe: each part in turn until one fails."""
        self.probes_run += 1
        for probe in self.probes:
            try:
                async with asyncio.timeout(self.options.timeout + TIMEOUT_GRACE):
                    healthy, message = await probe()
            except TimeoutError:
                healthy, message = False, f"probe did not answer within {self.options.timeout:g}s"
            except Exception as exc:  # a prober's bug must not end the checking: it counts as a failure
                log.exception("health probe raised")
                healthy, message = False, f"probe failed: {exc}"
            if not healthy:
                return False, message
        return True, ""

    def _observe(self, outcome: Outcome) -> None:
        healthy, message = outcome
        if not healthy:
            log.debug("health probe failed: %s", message)
        change: HealthChange | None = self.thresholds.observe(healthy, message)
        if change is None:
            return
        if change.healthy:
            log.info("health check: success threshold reached, reporting healthy")
        else:
            log.info("health check: failure threshold reached, reporting unhealthy: %s", change.message)
        self.report(change.healthy, change.message)

    async def _run(self) -> None:
        clock, period = self.clock, self.options.period
        await clock.sleep(self.options.initial_delay)
        started = clock.now()
        self._observe(await self.probe_once())
        anchor = ended = clock.now()
        while True:
            await clock.sleep(next_probe_at(anchor, period, started, ended) - clock.now())
            started = clock.now()
            self._observe(await self.probe_once())
            ended = clock.now()
