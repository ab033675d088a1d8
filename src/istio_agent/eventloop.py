"""The one event-loop factory: uvloop when it is installed, asyncio's own loop otherwise.

uvloop is optional (the `fast` extra); every program that makes its own loop
(the agent, the DNS proxy's io thread, benchmarks) gets it through here, so the
choice and its fallback are made in one place.
"""

from __future__ import annotations

import asyncio


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
