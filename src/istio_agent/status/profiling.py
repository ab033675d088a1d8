"""`/debug/pprof/` on the status server: what `--profiling` (on by default, as upstream's) serves here.

Upstream's agent serves Go's net/http/pprof there, to localhost only: a CPU profile, the goroutines'
stacks, the command line, symbols and an execution trace, in Go's formats. A Python process has no Go
runtime, so the paths that make sense for it answer in formats a Python user can read, and the Go-only
ones say so:

- `/debug/pprof/profile?seconds=N` (30 by default, as Go's): a sampling profile of every thread of the
  agent, sampled 100 times a second (Go's CPU profile rate) for N seconds, as collapsed stacks
  (`thread;file.py:function;...;file.py:function count` per line, root first: the input of
  flamegraph.pl, speedscope and inferno). The samples are wall-clock: a thread blocked in a wait counts
  where it waits, which is what an agent that idles on sockets mostly does. One profile at a time, as Go's.
- `/debug/pprof/goroutine`: the stack of every thread and of every asyncio task, as text.
- `/debug/pprof/cmdline`: the command line, its arguments separated by NUL bytes (Go's form).
- `/debug/pprof/`: the index of the above.
- `symbol`, `trace` and Go's runtime profiles (`heap`, `allocs`, `block`, `mutex`, `threadcreate`):
  501, naming what is available instead.

Sampling runs on a thread of its own and only while a profile is asked for; nothing of this module is
loaded by an agent started with `--profiling=false`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from types import FrameType

from istio_agent.httpio.routing import Router
from istio_agent.httpio.server_core import Request, Response, text_response
from istio_agent.netaddr import is_localhost

log = logging.getLogger(__name__)

PREFIX = "/debug/pprof/"
DEFAULT_SECONDS = 30  # Go's default profile length
MAX_SECONDS = 3600
SAMPLE_INTERVAL = 0.01  # 100 Hz, Go's CPU profile rate
GO_ONLY = ("symbol", "trace", "heap", "allocs", "block", "mutex", "threadcreate")
INDEX = """/debug/pprof/ (this agent is Python: Go's runtime profiles are not available)

profile?seconds=N  sampling profile of every thread for N seconds (default 30), as collapsed stacks
goroutine          the stack of every thread and asyncio task
cmdline            the command line, NUL-separated
"""


def frame_label(frame: FrameType) -> str:
    """`file.py:qualified.name` for a stack frame (no spaces or `;`: collapsed stacks split on them)."""
    code = frame.f_code
    name = getattr(code, "co_qualname", code.co_name)
    return f"{os.path.basename(code.co_filename)}:{name}".replace(" ", "_").replace(";", ":")


def collapse(thread: str, frame: FrameType | None) -> str:
    """One sample of one thread as a collapsed stack: the thread's name, then its frames from the root."""
    labels: list[str] = []
    while frame is not None:
        labels.append(frame_label(frame))
        frame = frame.f_back
    labels.append(thread.replace(" ", "_").replace(";", ":"))
    return ";".join(reversed(labels))


def render_collapsed(counts: Counter[str]) -> str:
    return "".join(f"{stack} {count}\n" for stack, count in sorted(counts.items()))


def sample_threads(seconds: float, stop: threading.Event, interval: float = SAMPLE_INTERVAL,
                   frames: Callable[[], dict[int, FrameType]] = sys._current_frames) -> Counter[str]:
    """Sample every other thread's stack each `interval` until `seconds` passed or `stop` is set."""
    me = threading.get_ident()
    counts: Counter[str] = Counter()
    end = time.monotonic() + seconds
    while not stop.is_set():
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        current = frames()
        for ident, frame in current.items():
            if ident != me:
                counts[collapse(names.get(ident, f"thread-{ident}"), frame)] += 1
        current.clear()  # frames keep their locals alive: hold none between samples
        if stop.wait(interval) or time.monotonic() >= end:
            break
    return counts


def profile_seconds(query: str) -> int:
    """The `seconds` of the query, as Go reads it: a positive integer, else the default."""
    for part in query.split("&"):
        key, _, value = part.partition("=")
        if key == "seconds":
            try:
                seconds = int(value)
            except ValueError:
                return DEFAULT_SECONDS
            return seconds if seconds > 0 else DEFAULT_SECONDS
    return DEFAULT_SECONDS


def thread_and_task_stacks(tasks: Iterable[asyncio.Task[object]]) -> str:
    import traceback  # on first use: its imports (linecache, tokenize) are not paid by every agent

    names = {thread.ident: thread.name for thread in threading.enumerate()}
    out: list[str] = []
    for ident, frame in sorted(sys._current_frames().items()):
        out.append(f"thread {names.get(ident, ident)} ({ident}):\n")
        out.extend(traceback.format_stack(frame))
        out.append("\n")
    for task in sorted(tasks, key=lambda t: t.get_name()):
        out.append(f"task {task.get_name()}:\n")
        for frame in task.get_stack():
            out.extend(traceback.format_stack(frame, limit=1))
        out.append("\n")
    return "".join(out)


class Profiler:
    """The `/debug/pprof/` routes of one status server (one profile at a time)."""

    def __init__(self) -> None:
        self._running: threading.Event | None = None

    def add_routes(self, app: Router) -> None:
        app.add(PREFIX, self.handle, prefix=True)

    async def handle(self, request: Request) -> Response:
        if not is_localhost(request.remote):
            return text_response(403, "Only requests from localhost are allowed")
        name = request.path[len(PREFIX):].strip("/")
        if name == "":
            return text_response(200, INDEX)
        if name == "profile":
            return await self._profile(request)
        if name == "goroutine":
            return text_response(200, thread_and_task_stacks(asyncio.all_tasks()))
        if name == "cmdline":
            return Response(200, "\x00".join(sys.argv).encode(), [("Content-Type", "text/plain; charset=utf-8")])
        if name in GO_ONLY:
            return text_response(501, f"{name}: a Go runtime profile; this agent is Python and serves profile, "
                                      "goroutine and cmdline (see /debug/pprof/)")
        return text_response(404, "Unknown profile")

    async def _profile(self, request: Request) -> Response:
        seconds = profile_seconds(request.query_string)
        if seconds > MAX_SECONDS:
            return text_response(400, f"profile duration over {MAX_SECONDS}s")
        if self._running is not None:
            return text_response(500, "Could not enable CPU profiling: cpu profiling already in use")
        stop = self._running = threading.Event()
        try:
            counts = await asyncio.to_thread(sample_threads, seconds, stop)
        finally:
            stop.set()  # also when the request is abandoned (the agent stops, the client goes away)
            self._running = None
        log.info("/debug/pprof/profile: %d samples over %ds", sum(counts.values()), seconds)
        return text_response(200, render_collapsed(counts))


def add_profiling_routes(app: Router) -> None:
    Profiler().add_routes(app)
