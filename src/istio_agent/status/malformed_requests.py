"""Malformed requests to the status port: answered 4xx, counted, and logged at most once per interval.

Anyone who can reach :15020 can send garbage, HTTPS, oversized headers or
unknown methods; logging each one (aiohttp logged a traceback per request)
would let them flood the agent's log. `MalformedRequestLog` is the server's
`on_malformed`: every refusal is counted (`on_malformed`, the
`istio_agent_status_malformed_requests_total` metric) and summarised in one
WARNING line per interval. Time is passed in (`clock`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

REPORT_INTERVAL = 60.0


class MalformedRequestLog:
    """Called with (peer, reason) for each refused request; one log line per `interval` at most."""

    def __init__(self, *, on_malformed: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic, interval: float = REPORT_INTERVAL) -> None:
        self._on_malformed = on_malformed
        self._clock = clock
        self._interval = interval
        self._last_report: float | None = None
        self.total = 0
        self.unreported = 0

    def __call__(self, peer: str | None, reason: str) -> None:
        self.total += 1
        self.unreported += 1
        self._on_malformed()
        now = self._clock()
        if self._last_report is not None and now - self._last_report < self._interval:
            return
        lines = reason.strip().splitlines()
        log.warning("status server: %d malformed request(s) answered 400 (latest from %s: %s); at most one such "
                    "line every %gs", self.unreported, peer or "?", (lines[0] if lines else "malformed")[:120],
                    self._interval)
        self._last_report = now
        self.unreported = 0
