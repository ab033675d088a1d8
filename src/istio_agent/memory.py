"""Keeping the agent's resident memory close to what it actually uses, and its collector out of the way.

Two glibc knobs, both measured on the 5,000-cluster push benchmark: capping
malloc arenas (gRPC's threads each get their own arena otherwise, and freed
push buffers stay mapped in them) and returning freed heap pages to the
kernel with `malloc_trim` after bursts: every 15 s, and a second after the
last of a burst of XDS streams closed (`MemoryTrimmer.soon()`; measured by
`benchmarks/bench_xds_hostile_streams.py`). Both are no-ops off glibc.

And Python's cyclic collector: once the agent has started, what start-up made
is frozen out of its reach (`freeze_start_up_objects`).
"""

from __future__ import annotations

import asyncio
import gc
import logging

from istio_agent import libc
from istio_agent.periodic import Periodic

log = logging.getLogger(__name__)

M_ARENA_MAX = -8
MALLOC_ARENAS = 2
TRIM_INTERVAL = 15.0
TRIM_SETTLE = 1.0


class Glibc:
    """glibc's `malloc_trim` and `mallopt` (`istio_agent.libc`: no `ctypes` package, no `find_library`, which
    runs `ldconfig -p`; together ~0.4 MB per agent)."""

    def __init__(self, trim_address: int, mallopt_address: int) -> None:
        self._trim = trim_address
        self._mallopt = mallopt_address

    def malloc_trim(self, pad: int) -> int:
        return libc.call(self._trim, pad)

    def mallopt(self, option: int, value: int) -> int:
        return libc.call(self._mallopt, option, value)


def _libc() -> Glibc | None:
    """This process's glibc, or None off glibc (musl has no malloc_trim)."""
    try:
        return Glibc(libc.function("malloc_trim"), libc.function("mallopt"))
    except (ImportError, OSError, AttributeError):
        return None


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas (as MALLOC_ARENA_MAX would); call before threads start."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(M_ARENA_MAX, arenas) == 1)


def freeze_start_up_objects() -> None:
    """Move every object alive now out of the cyclic collector's reach (`gc.freeze`).

    Start-up leaves ~41,000 tracked objects that live as long as the agent (modules, classes, options,
    protobuf descriptors). A full collection walks all of them while holding the GIL, so every thread
    waits, the DNS proxy's answering threads included: with forwarded queries keeping the collector
    busy, bench_dns's whole agent measured full collections of ~25 ms each, a dozen in 5 s; frozen,
    they take ~1 ms. No collection first: at this point start-up has left a few dozen unreachable
    objects (39 measured), not worth a full collection's 25-60 ms while Envoy starts.
    """
    gc.freeze()


def trim() -> None:
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


class MemoryTrimmer:
    """A component that hands freed heap back to the kernel every `interval` seconds, and `settle`
    seconds after `soon()`."""

    def __init__(self, interval: float = TRIM_INTERVAL, settle: float = TRIM_SETTLE) -> None:
        self._libc: Glibc | None = _libc()
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
