"""Blocking work the identity component hands off: never on the event loop, never in the way of exit.

Two kinds of job leave the event loop here: key generation (CPU-bound, seconds
for a large RSA key) and reads of certificate files (a slow or hung filesystem).
asyncio's default executor is the wrong home for both: its pool is small and
shared, so a few stuck reads would delay every other caller, and the interpreter
joins its threads at exit, so a SIGTERM during a long key generation would leave
the agent running until the key is done. Each job here gets its own daemon
thread instead: a stuck job delays only whoever awaits it, and a job still
running when the agent exits is abandoned with the process.

The jobs go through `loop.run_in_executor`, so `VirtualClock` counts them as
work in progress and holds virtual time still until they finish, as it does for
`asyncio.to_thread`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class DaemonThreadExecutor(concurrent.futures.Executor):
    """An executor that starts a new daemon thread for every job and keeps no pool (nothing to join)."""

    def __init__(self, name: str = "identity-job") -> None:
        self._name = name

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # handed to whoever awaits the job
                future.set_exception(exc)
            else:
                future.set_result(result)

        threading.Thread(target=run, name=self._name, daemon=True).start()
        return future


async def in_daemon_thread(name: str, fn: Callable[..., T], *args: object) -> T:
    """Run `fn(*args)` on its own daemon thread and await its result.

    Cancelling the caller stops the waiting, not the thread: a file read finishes
    on its own (it is size-capped), a key generation is abandoned at exit.
    """
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(DaemonThreadExecutor(name), fn, *args)
