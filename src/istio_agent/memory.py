"""Keeping the agent's resident memory close to what it actually uses.

Two glibc knobs, both measured on the 5,000-cluster push benchmark: capping
malloc arenas (gRPC's threads each get their own arena otherwise, and freed
push buffers stay mapped in them) and returning freed heap pages to the
kernel with `malloc_trim` after bursts: every 15 s, and a second after the
last of a burst of XDS streams closed (`MemoryTrimmer.soon()`; measured by
`benchmarks/bench_xds_hostile_streams.py`). Both are no-ops off glibc.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging

from istio_agent.periodic import Periodic

log = logging.getLogger(__name__)

M_ARENA_MAX = -8
MALLOC_ARENAS = 2
TRIM_INTERVAL = 15.0
TRIM_SETTLE = 1.0


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim  # noqa: B018 - glibc only
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas (as MALLOC_ARENA_MAX would); call before threads start."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(M_ARENA_MAX, arenas) == 1)


def trim() -> None:
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


class MemoryTrimmer:
    """A component that hands freed heap back to the kernel every `interval` seconds, and `settle`
    seconds after `soon()`."""

    def __init__(self, interval: float = TRIM_INTERVAL, settle: float = TRIM_SETTLE) -> None:
        self._libc = _libc()
        self._settle = settle
        self._ticker = Periodic(interval, self._trim, "malloc-trim")
        self._soon: asyncio.TimerHandle | None = None
        self._due = 0.0

    async def start(self) -> None:
        if self._libc is not None:
            await self._ticker.start()

    def soon(self) -> None:
        """Trim once `settle` seconds have passed without another call: memory was just freed (streams
        closed), and a burst of calls costs one trim, after its last. Call it on the event loop."""
        if self._libc is None or not self._ticker.running:
            return
        loop = asyncio.get_running_loop()
        self._due = loop.time() + self._settle
        if self._soon is None:
            self._soon = loop.call_at(self._due, self._trim_soon)

    def _trim_soon(self) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() < self._due:  # asked again since: wait for the burst to end
            self._soon = loop.call_at(self._due, self._trim_soon)
            return
        self._soon = None
        assert self._libc is not None
        self._libc.malloc_trim(0)

    async def _trim(self) -> None:
        assert self._libc is not None
        self._libc.malloc_trim(0)

    async def stop(self) -> None:
        soon, self._soon = self._soon, None
        if soon is not None:
            soon.cancel()
        await self._ticker.stop()
