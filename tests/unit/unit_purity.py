"""The unit tier's purity guard: no sockets, no processes, no real sleeping.

A guard fails any unit test that
- opens an internet socket (AF_INET/AF_INET6) or binds or connects any socket
  (asyncio's own self-pipe, an unbound AF_UNIX socketpair, stays allowed);
- starts a process (subprocess, os.posix_spawn, fork, exec, os.system);
- sleeps for real for more than 0.1 s: `time.sleep`, or an event loop waiting
  on its timers with nothing else to do (a thread's result arriving is work,
  not sleep).

Python's audit hooks see the first two wherever they happen, including in
libraries; `time.sleep` is replaced while a unit test runs; the event loops
pytest-asyncio makes for the tier get a selector that measures its idle waits. Tests that need any of these belong in
tests/component or above; scenarios over time run on `istio_agent.clock.VirtualClock`.
`tests/unit/conftest.py` switches the guard on around every unit test.
"""

from __future__ import annotations

import asyncio
import selectors
import socket
import sys
import time
from typing import Any

from istio_agent.clock import SelectorWrapper

REAL_SLEEP_LIMIT = 0.1  # seconds of real idle waiting a unit test may spend, in all

_PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.exec",
                             "os.system", "pty.spawn"})
_INTERNET = (socket.AF_INET, socket.AF_INET6)
_REAL_SLEEP = time.sleep


class PurityViolation(AssertionError):
    """A unit test did something only the component tier may do."""


class Guard:
    def __init__(self) -> None:
        self.active = False
        self.test = ""
        self.slept = 0.0
        self.violations: list[str] = []

    def violate(self, what: str) -> None:
        message = f"unit test {self.test} {what}; it belongs in tests/component (or use VirtualClock)"
        self.violations.append(message)
        raise PurityViolation(message)

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active:
            return
        if event in _PROCESS_EVENTS:
            self.violate(f"started a process ({event} {args[0] if args else ''})")
        elif event == "socket.__new__" and len(args) > 1 and args[1] in _INTERNET:
            self.violate("opened an internet socket")
        elif event in ("socket.bind", "socket.connect", "socket.connect_ex"):
            self.violate(f"used a socket ({event} {args[1] if len(args) > 1 else ''})")

    def sleep(self, seconds: float) -> None:
        """Stands in for `time.sleep` while a unit test runs (Python 3.11 has no audit event for it)."""
        if self.active and seconds > 0:
            self.slept += seconds
            if self.slept > REAL_SLEEP_LIMIT:
                self.violate(f"slept for real ({self.slept:.2f}s in time.sleep)")
        _REAL_SLEEP(seconds)

    def idle(self, seconds: float) -> None:
        if not self.active:
            return
        self.slept += seconds
        if self.slept > REAL_SLEEP_LIMIT:
            self.violations.append(
                f"unit test {self.test} waited {self.slept:.2f}s for real on event-loop timers; "
                "it belongs in tests/component (or use VirtualClock)")


GUARD = Guard()
sys.addaudithook(GUARD.audit)


class IdleTimingSelector(SelectorWrapper):
    """The loop's selector, measuring the time it waits and wakes with nothing to do (a timer: a real sleep)."""

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        started = time.monotonic()
        ready = self._inner.select(timeout)
        if not ready and timeout:
            GUARD.idle(time.monotonic() - started)
        return ready


def guarded_event_loop() -> asyncio.AbstractEventLoop:
    """An asyncio loop whose idle waits the guard counts."""
    return asyncio.SelectorEventLoop(IdleTimingSelector())
