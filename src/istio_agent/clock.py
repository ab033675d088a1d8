"""Time as something a component is given: now, sleep, and call-at.

Components that decide things by the clock (certificate rotation, Envoy's drain,
the first-certificate head start) take a `Clock` instead of calling `time` and
`asyncio` directly, so that their tests can run hours of schedule in
milliseconds. Two implementations:

- `SystemClock`: wall-clock time (certificates expire by the wall clock) with
  timers on the running asyncio loop. What the agent runs with.
- `VirtualClock`: for tests. It runs a coroutine on its own event loop whose
  time only moves when every task is waiting on a timer; then it jumps straight
  to the next timer (trio's `MockClock(autojump_threshold=0)` is the model).
  Because the loop's own time is virtual, `asyncio.sleep` and `asyncio.wait_for`
  inside the code under test jump too. Work handed to a thread
  (`asyncio.to_thread`, `run_in_executor`) holds time still until it finishes,
  so a key generated in a worker thread never makes a timeout fire early.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Wall-clock seconds and timers; every method is called on the event loop's thread."""

    def now(self) -> float:
        """Seconds since the epoch (what certificate validity is measured in)."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable:
        """Run `callback` on the loop once `now()` reaches `when` (at once if it already has)."""
        ...


class SystemClock:
    """The real clock: `time.time()` and the running loop's timers."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable:
        return asyncio.get_running_loop().call_later(max(0.0, when - time.time()), callback)


# How long the virtual loop waits for real I/O or thread results before it looks at its timers again.
_REAL_WAIT = 0.05


class SelectorWrapper(selectors.BaseSelector):
    """A selector that hands everything to `inner`; subclasses change `select()` (to measure or to jump time)."""

    def __init__(self, inner: selectors.BaseSelector | None = None) -> None:
        self._inner = inner or selectors.DefaultSelector()

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.get_key(fileobj)

    def get_map(self) -> Any:
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        return self._inner.select(timeout)


class _JumpingSelector(SelectorWrapper):
    """When nothing is ready and no thread is working, time jumps to the next timer."""

    def __init__(self, loop: _VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._inner.select(0)
        if ready or timeout == 0:
            return ready
        if self._loop.threads_busy() or timeout is None:
            # Real work is under way (a worker thread, a socket): wait for it in real time.
            return self._inner.select(_REAL_WAIT if timeout is not None else None)
        self._loop.advance(timeout)
        return []


class _VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose `time()` is virtual and jumps over idle waits."""

    def __init__(self) -> None:
        self._virtual_now = 0.0
        self._busy = 0  # executor jobs whose results have not reached the loop yet (loop thread only)
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += max(0.0, seconds)

    def threads_busy(self) -> bool:
        return self._busy > 0

    def run_in_executor(self, executor: Any, func: Callable[..., T], *args: Any) -> asyncio.Future[T]:  # type: ignore[override]
        # Time stands still until the result is on the loop: the count drops in a done-callback, which
        # runs only after the result was delivered, so no jump can slip in between.
        self._busy += 1
        future = super().run_in_executor(executor, func, *args)
        future.add_done_callback(self._thread_done)
        return future

    def _thread_done(self, _future: asyncio.Future[Any]) -> None:
        self._busy -= 1


class VirtualClock:
    """A `Clock` in virtual time; `run(coro)` runs a test scenario on its loop.

    `now()` starts at `epoch` and advances with the loop's virtual time, so a
    certificate issued "now" by a test CA and the cache checking its expiry agree.
    """

    def __init__(self, epoch: float = 1_800_000_000.0) -> None:
        self.epoch = epoch
        self.loop = _VirtualTimeLoop()

    def now(self) -> float:
        return self.epoch + self.loop.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable:
        return self.loop.call_at(max(self.loop.time(), when - self.epoch), callback)

    def elapsed(self) -> float:
        """Virtual seconds since the clock was made."""
        return self.loop.time()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` to completion in virtual time, then close the loop (cancelling what is left)."""
        try:
            return self.loop.run_until_complete(coro)
        finally:
            pending = [task for task in asyncio.all_tasks(self.loop) if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()
