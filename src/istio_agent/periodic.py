"""A step run every `interval` seconds on the event loop, with `async start()` / `async stop()`.

The polling loop that the certificate file watcher, istiod-local's registry
watcher and the heap trimmer share. It is a plain library (no agent
component imports), so `controlplane/` may use it too. What a step does, and
how its failures are logged, stays with its owner: an exception escaping a
step ends the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable


class Periodic:
    """Calls `step()` after each `interval` seconds until stopped; starting twice starts once."""

    def __init__(self, interval: float, step: Callable[[], Awaitable[None]], name: str) -> None:
        self.interval = interval
        self.name = name
        self._step = step
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.start_soon()

    def start_soon(self) -> None:
        """As `start()`, from code that is not a coroutine (it must run on the event loop's thread)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    @property
    def running(self) -> bool:
        return self._task is not None

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self._step()
