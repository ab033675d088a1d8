"""The workload health checker's decisions (sans-IO): which probe results change the reported state, and when
the next probe runs.

Upstream's rules (`pkg/istio-agent/health`), restated:

- State starts undefined: nothing is reported until a threshold is reached,
  so the first report may be healthy or unhealthy.
- A success counts towards `success_threshold` and clears the failure count; a
  failure counts towards `failure_threshold` and clears the success count.
  When a count reaches its threshold and the state is not already that one,
  the new state is reported and the count restarts from zero. With a
  threshold of 1 the first probe's result is reported at once.
- Only changes are reported (no heartbeat): a workload staying healthy sends
  one report, however many probes pass.
- Timing: after `initial_delay`, the first probe runs at once; a ticker of
  `period` starts when that probe has finished. A probe that overruns the
  period runs the next one as soon as it ends (one missed tick is kept, the
  others are dropped, as Go's ticker does), else the next tick is awaited.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class HealthChange:
    """A state change to report: healthy, or not with the failing probe's message."""

    healthy: bool
    message: str = ""


@dataclass
class HealthThresholds:
    """Consecutive probe results in, state changes out."""

    success_threshold: int = 1
    failure_threshold: int = 1
    successes: int = 0
    failures: int = 0
    state: bool | None = None  # None: nothing reported yet

    def observe(self, healthy: bool, message: str = "") -> HealthChange | None:
        """One probe's result; the change to report, or None."""
        if healthy:
            self.successes += 1
            self.failures = 0
            if self.successes == self.success_threshold and self.state is not True:
                self.successes, self.state = 0, True
                return HealthChange(True)
            return None
        self.failures += 1
        self.successes = 0
        if self.failures == self.failure_threshold and self.state is not False:
            self.failures, self.state = 0, False
            return HealthChange(False, message)
        return None


def next_probe_at(anchor: float, period: float, started: float, ended: float) -> float:
    """When the probe after one that ran from `started` to `ended` begins.

    Ticks fall at `anchor + k * period` (k >= 1; the anchor is when the first probe
    ended). The first tick after `started` is the one this probe leaves pending:
    if it fell while the probe ran, the next probe starts when it ended; if not,
    at that tick.
    """
    if period <= 0:
        raise ValueError(f"period must be positive, got {period}")
    ticks = max(1, math.floor((started - anchor) / period) + 1)
    tick = anchor + ticks * period
    while tick <= started:  # floating-point rounding: the tick must be strictly after the start
        tick += period
    return max(tick, ended)
