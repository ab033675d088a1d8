"""The one event-loop factory: uvloop when it is installed, asyncio's own loop otherwise.

uvloop is optional (the `fast` extra); every program that makes its own loop
(the agent, the DNS proxy's io thread, benchmarks) gets it through here, so the
choice and its fallback are made in one place. The agent's main loop asks for
asyncio's own (`prefer_uvloop=False`, see `agent.run_agent`: uvloop costs memory
there and gRPC's threads do the I/O); the DNS proxy's io thread, which serves
the queries itself, takes uvloop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def new_event_loop(prefer_uvloop: bool = True) -> asyncio.AbstractEventLoop:
    """A new loop, not yet set as current; uvloop's when `prefer_uvloop` and it imports."""
    if prefer_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on a loop from `new_event_loop()` (the benchmarks' stand-ins run like the agent)."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
