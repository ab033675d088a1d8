"""The workload certificate's lifecycle, as a sans-IO state machine.

Every decision the secret cache makes about its CA-issued certificate lives
here, with time passed in: when to ask the CA (pre-warm, on demand, at the
rotation time, after a failure with backoff), what a new certificate sets off
(OUTPUT_CERTS written, `default` pushed when it replaces one, `ROOTCA` pushed
when the root changed), and when a certificate that could not be renewed stops
being served (at its expiry, never later). The asyncio adapter
(`security/cache.py`) performs the returned actions and calls `timer(now)` at
`deadline()`; tests drive the same machine with plain numbers.

Events in, actions out:

    start(now) / demand(now) -> [Request]        (unless one is in flight or a valid cert is held)
    issued(item, now)        -> [Write, Push...]
    failed(reason, now)      -> [Retry]
    timer(now)               -> [Expire] and/or [Request]
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from istio_agent.security.core.rotation import Backoff, rotation_time
from istio_agent.security.core.secrets import ROOT_RESOURCE, WORKLOAD_RESOURCE, SecretItem


@dataclass(frozen=True)
class Request:
    """Ask the CA for a new certificate now (one request at a time)."""


@dataclass(frozen=True)
class Write:
    """Write this certificate to OUTPUT_CERTS (when configured)."""

    item: SecretItem


@dataclass(frozen=True)
class Push:
    """Tell the SDS streams watching `name` that it changed."""

    name: str


@dataclass(frozen=True)
class Expire:
    """Give up the certificate: it expired without a replacement and must never be served again."""

    item: SecretItem


@dataclass(frozen=True)
class Retry:
    """The request failed; the next one goes out in `delay` seconds (`serving`: a valid certificate is still held)."""

    reason: str
    delay: float
    serving: bool


Action = Request | Write | Push | Expire | Retry


@dataclass(frozen=True)
class RenewalPolicy:
    """When to renew: `expiry - (ratio ± jitter) * lifetime`, and how failures back off."""

    grace_period_ratio: float = 0.5
    grace_period_ratio_jitter: float = 0.01
    retry_initial: float = 0.1
    retry_max: float = 10.0


class CertificateLifecycle:
    """Holds the current certificate and decides every step of its renewal; no I/O, no clock of its own."""

    def __init__(self, policy: RenewalPolicy, rand: Callable[[], float] = random.random) -> None:
        self.policy = policy
        self._rand = rand
        self._backoff = Backoff(policy.retry_initial, policy.retry_max, rand=rand)
        self.current: SecretItem | None = None
        self.rotate_at = 0.0
        self.in_flight = False
        self.issued_count = 0
        self._next_attempt: float | None = None  # None: nothing scheduled (stopped, or waiting on demand)
        self._last_root = b""

    # --- queries ----------------------------------------------------------------------------------------
    def valid(self, now: float) -> SecretItem | None:
        """The certificate to serve at `now`: never one at or past its expiry."""
        item = self.current
        if item is None or item.expires <= now:
            return None
        return item

    @property
    def last_root(self) -> bytes:
        """The root of the newest certificate issued (kept after that certificate expires)."""
        return self._last_root

    def deadline(self) -> float | None:
        """When `timer()` must next be called: the next CA request or the current certificate's expiry."""
        candidates: list[float] = []
        if self._next_attempt is not None and not self.in_flight:
            candidates.append(self._next_attempt)
        if self.current is not None:
            candidates.append(self.current.expires)
        return min(candidates) if candidates else None

    # --- events -----------------------------------------------------------------------------------------
    def start(self, now: float) -> list[Action]:
        """Pre-warm: get a certificate at once, and keep one from then on."""
        self._next_attempt = now
        return self.timer(now)

    def demand(self, now: float) -> list[Action]:
        """Someone needs a certificate now (an SDS request with none cached): ask unless already asking."""
        if self.valid(now) is not None or self.in_flight:
            return []
        self.in_flight = True
        return [Request()]

    def timer(self, now: float) -> list[Action]:
        """A deadline passed: expire what is stale, ask the CA when it is time."""
        actions: list[Action] = []
        current = self.current
        if current is not None and current.expires <= now:
            self.current = None
            actions.append(Expire(current))
        due = self._next_attempt is not None and now >= self._next_attempt
        if due and not self.in_flight:
            self.in_flight = True
            actions.append(Request())
        return actions

    def issued(self, item: SecretItem, now: float) -> list[Action]:
        """A new certificate arrived: keep it, schedule its rotation, and say who must hear of it."""
        replaced = self.current is not None or self.issued_count > 0
        self.in_flight = False
        self.current = item
        self.issued_count += 1
        self._backoff.reset()
        policy = self.policy
        self.rotate_at = rotation_time(item.created, item.expires, policy.grace_period_ratio,
                                       policy.grace_period_ratio_jitter, self._rand(), now)
        if self._next_attempt is not None:  # maintained (pre-warmed): rotate on schedule
            self._next_attempt = self.rotate_at
        actions: list[Action] = [Write(item)]
        if replaced:  # the first certificate goes straight to whoever asked; later ones replace a served one
            actions.append(Push(WORKLOAD_RESOURCE))
        if self._last_root and self._last_root != item.root_cert:
            actions.append(Push(ROOT_RESOURCE))
        self._last_root = item.root_cert
        return actions

    def failed(self, reason: str, now: float) -> list[Action]:
        """The CA request failed: retry with backoff (forever, while maintained); expiry is the timer's job."""
        self.in_flight = False
        delay = self._backoff.next()
        if self._next_attempt is not None:
            self._next_attempt = now + delay
        return [Retry(reason, delay, self.valid(now) is not None)]

    def stop(self) -> None:
        """No more scheduled requests (the agent is stopping)."""
        self._next_attempt = None
