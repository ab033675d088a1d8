"""When to stop Envoy after SIGTERM: a small state machine, time passed in.

Two policies, as upstream: wait `terminationDrainDuration` and stop; or, with
`EXIT_ON_ZERO_ACTIVE_CONNECTIONS`, wait at least `MINIMUM_DRAIN_DURATION` and
then stop as soon as application listeners have no downstream connections
(polled every second), or when Envoy cannot tell (no such stats).
"""

from __future__ import annotations

from dataclasses import dataclass

from istio_agent.envoy.stats import ISTIO_LISTENER_STATS


@dataclass(frozen=True)
class DrainPolicy:
    termination_drain_duration: float
    exit_on_zero_active_connections: bool
    minimum_drain_duration: float
    poll_interval: float = 1.0
    # The listeners left out of the active connection count (stats.istio_listener_stats of the ports).
    istio_listener_stats: frozenset[str] = ISTIO_LISTENER_STATS


@dataclass(frozen=True)
class DrainStep:
    """What to do next: stop now, or wait `wait` seconds and (maybe) poll active connections again."""

    stop: bool
    wait: float = 0.0
    poll_connections: bool = False
    reason: str = ""


def next_step(policy: DrainPolicy, started_at: float, now: float, active_connections: int | str | None) -> DrainStep:
    """Decide the next step of a drain started at `started_at`.

    `active_connections` is the last poll's result: a count, None when Envoy has no such
    stats, or the string "unpolled" before the first poll.
    """
    elapsed = now - started_at
    if not policy.exit_on_zero_active_connections:
        remaining = policy.termination_drain_duration - elapsed
        if remaining <= 0:
            return DrainStep(stop=True, reason="termination drain duration elapsed")
        return DrainStep(stop=False, wait=remaining)
    remaining_minimum = policy.minimum_drain_duration - elapsed
    if remaining_minimum > 0:
        return DrainStep(stop=False, wait=remaining_minimum, poll_connections=True)
    if active_connections == "unpolled":
        return DrainStep(stop=False, wait=0.0, poll_connections=True)
    if active_connections is None:
        return DrainStep(stop=True, reason="Envoy reports no downstream connection stats")
    if active_connections == 0:
        return DrainStep(stop=True, reason="no active downstream connections")
    return DrainStep(stop=False, wait=policy.poll_interval, poll_connections=True,
                     reason=f"{active_connections} active downstream connections")
