"""When to rotate a certificate, and how long to wait between failed attempts.

Pure arithmetic, no clocks: callers pass `now` and a uniform random number, so
the schedule is tested exactly and fleets of pods still spread their renewals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


def jittered_ratio(ratio: float, jitter: float, rand: float) -> float:
    """`ratio ± jitter`, uniformly spread by `rand` in [0, 1) (0.5 = no jitter), clamped to [0, 1]."""
    value = ratio + (2.0 * rand - 1.0) * jitter
    return min(1.0, max(0.0, value))


def rotation_time(
    issued_at: float, expires_at: float, ratio: float, jitter: float, rand: float, now: float
) -> float:
    """The moment to fetch a new certificate: `expiry - (ratio ± rand*jitter) * lifetime`, never before `now`.

    `issued_at` is when the agent received the certificate, as upstream measures the
    lifetime from its own creation time: a CA backdates `notBefore` by minutes to
    tolerate clock skew, which would make short-lived certificates look older than
    they are and rotate them in a loop.
    """
    lifetime = max(0.0, expires_at - issued_at)
    grace = jittered_ratio(ratio, jitter, rand) * lifetime
    return max(now, expires_at - grace)


@dataclass
class Backoff:
    """Exponential backoff with ±`spread` jitter that never gives up (the caller decides when to stop).

    Used for pre-warming and for rotation retries: a CA that is down for an hour
    must still be retried, but not more often than every `maximum` seconds.
    """

    initial: float = 0.1
    maximum: float = 10.0
    multiplier: float = 2.0
    spread: float = 0.1
    rand: Callable[[], float] = field(default=lambda: 0.5)
    _current: float = field(default=0.0, init=False)

    def next(self) -> float:
        base = self.initial if self._current == 0.0 else min(self.maximum, self._current * self.multiplier)
        self._current = base
        return base * (1.0 + (2.0 * self.rand() - 1.0) * self.spread)

    def reset(self) -> None:
        self._current = 0.0


# Upstream's CA client retries with grpc_retry: at most 5 calls in all, exponential
# from 100 ms with 10 % jitter between them.
CA_MAX_ATTEMPTS = 5
CA_RETRY_BASE = 0.1
CA_RETRY_JITTER = 0.1


def ca_retry_delay(attempt: int, rand: float) -> float:
    """Delay before call number `attempt` (0-based): 0, then 100, 200, 400, 800 ms, each ±10 %."""
    if attempt <= 0:
        return 0.0
    base = CA_RETRY_BASE * (2 ** (attempt - 1))
    return base * (1.0 + (2.0 * rand - 1.0) * CA_RETRY_JITTER)
