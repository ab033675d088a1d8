"""Malformed requests to the status port: answered 400 by aiohttp, counted, and logged at most once per interval.

aiohttp already refuses a request it cannot parse with 400, but logs each one at
ERROR with a multi-line traceback (HTTPS or garbage on the port is logged at
DEBUG only on a connection's first request). Anyone who can reach :15020 could
flood the agent's log that way. `MalformedRequestLog` stands in for aiohttp's
server logger: parse failures are counted and summarised in one WARNING line per
interval; everything else passes through to the real logger unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger(__name__)

REPORT_INTERVAL = 60.0


class MalformedRequestLog:
    """aiohttp's `logger=`: the parse failures are counted and reported in one line per `interval`."""

    def __init__(self, inner: logging.Logger, *, on_malformed: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic, interval: float = REPORT_INTERVAL) -> None:
        self._inner = inner
        self._on_malformed = on_malformed
        self._clock = clock
        self._interval = interval
        self._last_report: float | None = None
        self.total = 0
        self.unreported = 0

    def _malformed(self, args: tuple[Any, ...], exc: BaseException) -> None:
        self.total += 1
        self.unreported += 1
        self._on_malformed()
        now = self._clock()
        if self._last_report is not None and now - self._last_report < self._interval:
            return
        peer = args[0] if args else "?"
        reason = str(getattr(exc, "message", "") or exc).strip().splitlines()
        log.warning("status server: %d malformed request(s) answered 400 (latest from %s: %s); at most one such "
                    "line every %gs", self.unreported, peer, (reason[0] if reason else type(exc).__name__)[:120],
                    self._interval)
        self._last_report = now
        self.unreported = 0

    def _handled(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            self._malformed(args[1:], exc)
            return True
        return False

    def exception(self, *args: Any, **kwargs: Any) -> None:
        if not self._handled(args, kwargs):
            self._inner.exception(*args, **kwargs)

    def debug(self, *args: Any, **kwargs: Any) -> None:
        if not self._handled(args, kwargs):
            self._inner.debug(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
